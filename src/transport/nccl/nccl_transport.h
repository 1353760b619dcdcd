// Transports for the CUDA backend (device buffers): NCCL point-to-point, and MPI with host
// staging for ranks that share a GPU (where NCCL refuses to run).
#pragma once

#include <memory>
#include <string>

#include "transport/transport.h"

namespace ppb {

class MpiContext;

/// Collective: true on every rank iff no two ranks use the same GPU (same host and PCI bus id).
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

}  // namespace ppb
