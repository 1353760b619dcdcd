#include "transport/backend_registry.h"

#include "backend/cpu/cpu_gemm.h"
#include "common/error.h"
#include "mpi/mpi_context.h"

#if PPBENCH_HAVE_CUDA
#include "backend/cuda/cuda_device.h"
#include "transport/nccl/nccl_transport.h"
#endif

namespace ppb {

namespace {

BackendReg cpu_backend() {
  BackendReg b;
  b.name = "cpu";
  b.default_dtype = DType::f32;
  b.dtypes = {DType::f32};
  b.visible_devices = [] { return 1; };
  b.make_device = [](int) { return create_cpu_device(0); };
  b.make_transport = [](const MpiContext& mpi, Device&, TransportRequest request, MpiPollConfig poll,
                        std::string&) -> std::unique_ptr<Transport> {
    if (request == TransportRequest::nccl)
      throw UserError("--transport nccl needs GPUs (the CUDA backend on every rank); CPU ranks use --transport mpi");
    return create_mpi_transport(mpi, poll);
  };
  b.make_tp_group = [](const MpiContext& mpi, int color, int key, Device&, const MpiPollConfig& poll) {
    return create_mpi_tp_group(mpi, color, key, poll);
  };
  b.agree_on_libraries = [](const MpiContext& mpi) {
    // Every rank timed OpenBLAS against oneDNN on its own; one library for the whole run (oneDNN
    // if any rank found it faster), so that a unit computes the same on every rank and the
    // file's gemm_library holds for all of them.
    const int onednn = mpi.agree(cpu::gemm_library() == cpu::GemmLibrary::onednn ? 1 : 0);
    cpu::set_gemm_library(onednn ? cpu::GemmLibrary::onednn : cpu::GemmLibrary::openblas);
  };
  return b;
}

#if PPBENCH_HAVE_CUDA
BackendReg cuda_backend() {
  BackendReg b;
  b.name = "cuda";
  b.default_dtype = DType::bf16;
  b.dtypes = {DType::f32, DType::f16, DType::bf16};
  b.visible_devices = [] { return cuda_visible_device_count(); };
  b.make_device = [](int local_rank) { return create_cuda_device(local_rank); };
  b.make_transport = [](const MpiContext& mpi, Device& device, TransportRequest request, MpiPollConfig poll,
                        std::string& note) -> std::unique_ptr<Transport> {
    poll.max_sleep_us = 50.0;  // GPU decode steps are milliseconds: poll tighter
    const bool own = every_rank_has_own_gpu(mpi, device.bus_id());
    if (request == TransportRequest::nccl && !own)
      throw UserError("--transport nccl: some ranks share a GPU and NCCL refuses that; use --transport mpi or auto");
    if (request == TransportRequest::nccl || (request == TransportRequest::automatic && own))
      return create_nccl_transport(mpi, device, poll);
    if (request == TransportRequest::automatic)
      note = "ranks share a GPU: NCCL refuses that, so the transport falls back to MPI with pinned host staging";
    return create_staged_mpi_transport(mpi, poll);
  };
  b.make_tp_group = [](const MpiContext& mpi, int color, int key, Device& device, const MpiPollConfig&) {
    return create_nccl_tp_group(mpi, color, key, device);
  };
  return b;
}
#endif

}  // namespace

const std::vector<BackendReg>& backend_registry() {
  static const std::vector<BackendReg> backends = [] {
    std::vector<BackendReg> v;
#if PPBENCH_HAVE_CUDA
    v.push_back(cuda_backend());
#endif
    v.push_back(cpu_backend());
    return v;
  }();
  return backends;
}

const BackendReg& find_backend(const std::string& name) {
  std::string names;
  for (const BackendReg& b : backend_registry()) {
    if (b.name == name) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  if (name == "cuda")
    throw UserError("--device cuda: this build of ppbench has no CUDA backend (nvcc was not found at build time); use --device cpu");
  throw UserError("--device '" + name + "' is not a backend of this build; valid: auto, " + names);
}

}  // namespace ppb
