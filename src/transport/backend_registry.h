// The backends behind one registry (in the manner of ggml-backend's ggml_backend_reg): each
// says whether it can run here and makes its device, its pipeline transport and its
// tensor-parallel groups. `ppbench run` picks one by name (--device) or the first available
// one; nothing outside src/backend and src/transport knows which backends this binary has.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "backend/tensor_parallel.h"
#include "common/dtype.h"
#include "transport/transport.h"

namespace ppb {

class MpiContext;

/// What a backend's transport factory is asked for (--transport).
enum class TransportRequest { automatic, mpi, nccl };

/// One backend.
struct BackendReg {
  std::string name;            ///< "cuda", "cpu" (--device)
  DType default_dtype;         ///< --dtype auto
  std::vector<DType> dtypes;   ///< the element types it computes in (--dtype)
  /// Devices this process sees (0: the backend cannot run here).
  std::function<int()> visible_devices;
  /// This rank's device: the `local_rank`-th of the node's (modulo the visible ones).
  /// @throws ppb::UserError / InternalError as the backend's device constructor.
  std::function<std::unique_ptr<Device>(int local_rank)> make_device;
  /// Collective over the world: the pipeline's transport for `device`, as `request` asks (auto:
  /// the backend's best that works for these ranks). `note` receives what rank 0 should say when
  /// auto fell back ("" otherwise). `poll`: the waits' timeout and polling.
  /// @throws ppb::UserError when the request cannot be met (names --transport).
  std::function<std::unique_ptr<Transport>(const MpiContext& mpi, Device& device, TransportRequest request,
                                           MpiPollConfig poll, std::string& note)>
      make_transport;
  /// Collective over the world: this rank's tensor-parallel group for `color` (< 0: none, null),
  /// ordered by `key`, on `device`; `poll` for the groups that poll MPI (CPU).
  std::function<std::unique_ptr<TpGroup>(const MpiContext& mpi, int color, int key, Device& device,
                                         const MpiPollConfig& poll)>
      make_tp_group;
  /// Collective, after every rank made its device (null: nothing to agree on): the ranks agree on
  /// what their devices chose on their own, so that a unit computes the same on every rank (CPU:
  /// one GEMM library for the run).
  std::function<void(const MpiContext& mpi)> agree_on_libraries;
};

/// Every backend of this binary, most capable first (cuda when built, then cpu).
const std::vector<BackendReg>& backend_registry();

/// The backend named `name`. @throws ppb::UserError naming --device and this binary's backends
/// (a cuda request to a binary built without nvcc says so).
const BackendReg& find_backend(const std::string& name);

}  // namespace ppb
