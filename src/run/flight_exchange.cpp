#include "run/flight_exchange.h"

#include <time.h>

#include <memory>
#include <mutex>
#include <vector>

#include "common/check.h"
#include "common/clock.h"

namespace ppb::run {

namespace {

constexpr int kRequestTag = 1;  ///< a rank failed: send your record (payload: why)
constexpr int kRecordTag = 2;   ///< a rank's record, to rank 0

/// The texts of sends that may still be pending when the job ends: kept, never freed.
std::string* kept_text(const std::string& text) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::unique_ptr<std::string>>;
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::make_unique<std::string>(text));
  return kept->back().get();
}

void sleep_s(double s) {
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - static_cast<double>(static_cast<time_t>(s))) * 1e9)};
  nanosleep(&ts, nullptr);
}

/// A matched probe of a message of `tag` from anyone: its source and text; false if none waits.
bool receive_if_any(MPI_Comm comm, int tag, int* source, std::string* text) {
  int flag = 0;
  MPI_Message msg;
  MPI_Status status;
  if (MPI_Improbe(MPI_ANY_SOURCE, tag, comm, &flag, &msg, &status) != MPI_SUCCESS || !flag) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_CHAR, &count);
  text->assign(static_cast<size_t>(count), '\0');
  MPI_Mrecv(text->data(), count, MPI_CHAR, &msg, MPI_STATUS_IGNORE);
  *source = status.MPI_SOURCE;
  return true;
}

}  // namespace

FlightExchange::FlightExchange(const MpiContext& mpi, std::function<void(int, const std::string&)> on_request)
    : mpi_(mpi), on_request_(std::move(on_request)) {
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  listener_ = std::thread([this] { listen(); });
}

FlightExchange::~FlightExchange() {
  stop();
  MPI_Comm_free(&comm_);
}

void FlightExchange::stop() {
  stop_.store(true);
  if (listener_.joinable()) listener_.join();
}

void FlightExchange::listen() {
  while (!stop_.load()) {
    sleep_s(0.2);
    int from = -1;
    std::string why;
    if (!receive_if_any(comm_, kRequestTag, &from, &why)) continue;
    if (!asked_.exchange(true) && on_request_) on_request_(from, why);
  }
}

void FlightExchange::ask_peers(const std::string& why) {
  if (asked_.exchange(true)) return;
  for (int r = 0; r < mpi_.size(); ++r) {
    if (r == mpi_.rank()) continue;
    MPI_Request req;
    std::string* text = kept_text(why);  // the buffer must outlive the send
    if (MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_CHAR, r, kRequestTag, comm_, &req) == MPI_SUCCESS)
      MPI_Request_free(&req);
  }
}

void FlightExchange::send_record(const std::string& record, double limit_s) {
  if (mpi_.is_root()) return;
  std::string* text = kept_text(record);  // the send may still be pending when we give up
  MPI_Request req;
  if (MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_CHAR, 0, kRecordTag, comm_, &req) != MPI_SUCCESS)
    return;
  const double t0 = monotonic_s();
  for (int done = 0; !done && monotonic_s() - t0 < limit_s; sleep_s(0.01))
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
}

std::vector<std::string> FlightExchange::collect(const std::string& mine, double limit_s) {
  std::vector<std::string> all(static_cast<size_t>(mpi_.size()));
  if (!mpi_.is_root()) return all;
  all[0] = mine;
  int missing = mpi_.size() - 1;
  const double t0 = monotonic_s();
  while (missing > 0 && monotonic_s() - t0 < limit_s) {
    int from = -1;
    std::string text;
    if (!receive_if_any(comm_, kRecordTag, &from, &text)) {
      sleep_s(0.01);
      continue;
    }
    if (from > 0 && from < mpi_.size() && all[from].empty()) --missing;
    if (from > 0 && from < mpi_.size()) all[from] = std::move(text);
  }
  return all;
}

}  // namespace ppb::run
