// MPI transport on CPU lanes: round trips, ordering, and that a waiting lane sleeps.
#include <gtest/gtest.h>
#include <mpi.h>

#include <numeric>
#include <vector>

#include "backend/device.h"
#include "mpi_test_main.h"
#include "transport/transport.h"

namespace ppb {
namespace {

TEST(MpiTransport, RingRoundTripPreservesBytesAndOrder) {
  const auto& mpi = test::mpi();
  auto device = create_cpu_device(1);
  auto transport = create_mpi_transport(mpi, {});
  auto send_lane = device->create_lane("send");
  auto recv_lane = device->create_lane("recv");
  const int n = mpi.size(), r = mpi.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Several messages of different sizes in flight at once, tags in order: MPI's non-overtaking
  // rule plus the lanes' FIFO order must deliver each one intact.
  const std::vector<size_t> sizes{4, 1000, 1 << 20, 12, 300000};
  std::vector<std::vector<int32_t>> out(sizes.size()), in(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    out[k].resize(sizes[k] / 4);
    std::iota(out[k].begin(), out[k].end(), static_cast<int32_t>(r * 1000003 + k * 17));
    in[k].assign(sizes[k] / 4, -1);
    transport->enqueue_recv(*recv_lane, in[k].data(), sizes[k], prev, static_cast<int>(k));
    transport->enqueue_send(*send_lane, out[k].data(), sizes[k], next, static_cast<int>(k));
  }
  send_lane->synchronize();
  recv_lane->synchronize();
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<int32_t> expect(sizes[k] / 4);
    std::iota(expect.begin(), expect.end(), static_cast<int32_t>(prev * 1000003 + k * 17));
    EXPECT_EQ(in[k], expect) << "message " << k;
  }
}

TEST(MpiTransport, WaitingRecvLaneDoesNotSpin) {
  // Rank 1 posts a receive that rank 0 satisfies only after 1 s. Open MPI's MPI_Wait would
  // burn ~1 s of CPU on the waiting thread; the transport's MPI_Test + sleep loop must use a
  // small fraction of it, so the compute lane keeps its core.
  const auto& mpi = test::mpi();
  auto device = create_cpu_device(1);
  auto transport = create_mpi_transport(mpi, {});
  auto lane = device->create_lane("recv");
  int32_t value = 0;
  if (mpi.rank() == 1) {
    double cpu0 = lane->cpu_time_s();
    double t0 = monotonic_s();
    transport->enqueue_recv(*lane, &value, sizeof(value), 0, 99);
    lane->synchronize();
    double wall = monotonic_s() - t0;
    double cpu = lane->cpu_time_s() - cpu0;
    EXPECT_EQ(value, 42);
    EXPECT_GT(wall, 0.9);
    EXPECT_LT(cpu / wall, 0.05) << "recv lane used " << cpu << " s CPU over " << wall << " s waiting";
    std::printf("waiting recv lane: %.4f s CPU over %.3f s wall (%.2f%%)\n", cpu, wall, 100 * cpu / wall);
  } else if (mpi.rank() == 0) {
    timespec ts{1, 0};
    nanosleep(&ts, nullptr);
    value = 42;
    transport->enqueue_send(*lane, &value, sizeof(value), 1, 99);
    lane->synchronize();
  }
}

TEST(MpiTransport, RecvTimesOutNamingThePeer) {
  // Nobody sends: the wait must end after the timeout with a message naming peer and tag.
  const auto& mpi = test::mpi();
  auto device = create_cpu_device(1);
  MpiPollConfig poll;
  poll.timeout_s = 0.3;
  auto transport = create_mpi_transport(mpi, poll);
  auto lane = device->create_lane("recv");
  int32_t value = 0;
  const int peer = (mpi.rank() + 1) % mpi.size();
  transport->enqueue_recv(*lane, &value, sizeof(value), peer, 12345);
  try {
    lane->synchronize();
    FAIL() << "expected a timeout";
  } catch (const std::exception& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("timed out"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank " + std::to_string(peer)), std::string::npos) << msg;
    EXPECT_NE(msg.find("tag 12345"), std::string::npos) << msg;
  }
  // The withdrawn receive matches nothing any more: once every rank has given up, each sends its
  // rank to the one that waited on it, late, with the same tag, and a new receive gets it. Plain
  // MPI: the process's lanes stay aborted after the failure (backend/lane_abort.h).
  mpi.barrier();
  const int32_t mine = 1000 + mpi.rank();
  int32_t late = -1;
  const int waiter = (mpi.rank() + mpi.size() - 1) % mpi.size();
  MPI_Request reqs[2];
  MPI_Irecv(&late, 1, MPI_INT32_T, peer, 12345, MPI_COMM_WORLD, &reqs[0]);
  MPI_Isend(&mine, 1, MPI_INT32_T, waiter, 12345, MPI_COMM_WORLD, &reqs[1]);
  int done = 0;
  for (const double t0 = monotonic_s(); !done && monotonic_s() - t0 < 10.0;)
    MPI_Testall(2, reqs, &done, MPI_STATUSES_IGNORE);
  ASSERT_TRUE(done) << "the late message did not reach a new receive within 10 s";
  EXPECT_EQ(late, 1000 + peer);
  EXPECT_EQ(value, 0) << "the withdrawn receive's buffer was written";
}

}  // namespace
}  // namespace ppb
