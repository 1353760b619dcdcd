// Transports for the CUDA backend (device buffers): NCCL point-to-point, and MPI with host
// staging for ranks that share a GPU (where NCCL refuses to run).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace ppb {

class MpiContext;

/// Collective: true on every rank iff no two ranks use the same GPU (same machine, i.e. kernel,
/// and PCI bus id: containers of one machine that see the same GPU are different nodes).
/// `bus_id` is this rank's Device::bus_id(). NCCL needs this; with --transport auto, false
/// means falling back to create_staged_mpi_transport (and saying so).
bool every_rank_has_own_gpu(const MpiContext& mpi, const std::string& bus_id);

/// Collective over MPI_COMM_WORLD: the NCCL transport on the CUDA device `device`.
/// A world communicator is made at once (ncclGetUniqueId on rank 0, MPI_Bcast,
/// ncclCommInitRank), which checks that NCCL works. Messages then travel on one two-rank
/// communicator per *directed* pair (src -> dst), made on first use (the id goes src -> dst by
/// MPI): a communicator serialises its operations across streams, so a send and a receive of
/// one rank on the same communicator could block each other on the pipeline's ring; per-pair
/// directed communicators never do. NCCL matches messages in issue order per pair, so `tag` is
/// not used (the pipeline issues each pair's messages in the same order on both sides).
/// ncclSend/ncclRecv run on the lane's stream (the lane must be a CUDA lane); the barrier is
/// MPI_Ibarrier polled on a lane host task, as in the MPI transport.
/// @throws ppb::UserError if NCCL cannot initialise (e.g. two ranks on one GPU).
std::unique_ptr<Transport> create_nccl_transport(const MpiContext& mpi, const Device& device, const MpiPollConfig& poll);

/// MPI transport for device buffers through pinned host staging: a send is a device-to-host
/// cudaMemcpyAsync on the lane's stream, then the MPI transport's polled MPI_Isend in a lane
/// host task; a receive is the polled MPI_Irecv then a host-to-device copy. One staging buffer
/// per lane and direction suffices: the lane runs in order, so the next copy into it starts
/// only after the previous message left. Works for any number of ranks per GPU.
std::unique_ptr<Transport> create_staged_mpi_transport(const MpiContext& mpi, const MpiPollConfig& poll);

class TpGroup;
/// Collective over MPI_COMM_WORLD (issue 14): splits the world into tensor-parallel groups, one
/// per distinct `color` >= 0 (ranks ordered by `key`), and returns this rank's group as an NCCL
/// communicator on the CUDA device `device` (null for color < 0): the CUDA stage's all-reduces
/// (ncclAllReduce, sum, in the stage's dtype) and the head's all-gather run on the forward's
/// stream, inside a decode graph's capture too. Each rank of a group needs its own GPU.
/// @throws ppb::UserError if NCCL cannot initialise a group (e.g. two ranks on one GPU).
std::unique_ptr<TpGroup> create_nccl_tp_group(const MpiContext& mpi, int color, int key, const Device& device);

/// Tensor-parallel groups of one process over `devices` (ncclCommInitAll): group(i) for the
/// thread driving devices[i]. For tests of a CUDA stage of width > 1 on one node's GPUs.
std::vector<std::unique_ptr<TpGroup>> create_local_nccl_tp_groups(const std::vector<int>& devices);

}  // namespace ppb
