#include "run/context.h"

#include <iostream>

#include "common/clock.h"
#include "common/error.h"
#include "results/writer.h"

namespace ppb::run {

RunContext::RunContext(const MpiContext& mpi_context, const RunOptions& options)
    : mpi(mpi_context),
      opt(options),
      ranks(mpi_context.size()),
      root(mpi_context.is_root()),
      progress(mpi_context.is_root() && !options.quiet),
      phases_(mpi_context, options.timeout_s) {
  record_.run_start_s = monotonic_s();
  if (options.scenario.on()) {
    scenario_requests = options.scenario.drawn.requests;
    scenario_rate = options.scenario.spec->arrivals.request_rate;
  }
  phases_.set_failure_recorder(
      [this](const std::string& why, const std::vector<std::string>& flight_records) { record_failure(why, flight_records); });
  phases_.set_stall_handler([this]() -> std::string {
    if (!transport) return "";
    const std::string async = transport->async_error();
    transport->abort();  // e.g. ncclCommAbort: release streams blocked on a dead peer
    return async;
  });
}

RunRecord& RunContext::record() {
  if (!root) throw InternalError("the run's record is rank 0's (a bug: rank " + std::to_string(mpi.rank()) + " asked)");
  return record_;
}

const RunRecord& RunContext::record() const {
  if (!root) throw InternalError("the run's record is rank 0's (a bug: rank " + std::to_string(mpi.rank()) + " asked)");
  return record_;
}

const balance::Predictor& RunContext::predictor() const {
  if (!predictor_) throw InternalError("the run's predictions are rank 0's, from the plan on (a bug: rank " +
                                       std::to_string(mpi.rank()) + " asked)");
  return *predictor_;
}

void RunContext::make_predictor() {
  if (root) predictor_ = std::make_unique<balance::Predictor>(record_);
}

void RunContext::snapshot(const std::string& next_phase) {
  if (!root) return;
  record_.status = "running: " + next_phase;
  record_.elapsed_s = monotonic_s() - record_.run_start_s;
  write_results(output, record_, /*complete=*/false);
}

void RunContext::append_snapshot() {
  if (!root) return;
  record_.status = "running: benchmark";
  record_.elapsed_s = monotonic_s() - record_.run_start_s;
  append_results(output, record_);
}

void RunContext::record_failure(const std::string& why, const std::vector<std::string>& flight_records) {
  if (!root || output.empty() || record_.world_size == 0) return;
  record_.status = "failed";
  record_.failure = why;
  record_.flight_records = flight_records;
  record_.elapsed_s = monotonic_s() - record_.run_start_s;
  write_results(output, record_, /*complete=*/false);
  if (record_.profile.latency_ms.empty())
    std::cerr << "ppbench: the failure is recorded in " << output << " (complete=0, status=failed; nothing measured yet)" << std::endl;
  else
    std::cerr << "ppbench: what was measured before the failure is in " << output << " (complete=0)" << std::endl;
}

MpiPollConfig RunContext::tp_poll() const {
  MpiPollConfig poll;
  poll.timeout_s = opt.timeout_s;
  poll.spin_us = 200.0;
  poll.min_sleep_us = 5.0;
  poll.max_sleep_us = 50.0;
  return poll;
}

std::unique_ptr<TpGroup> RunContext::make_tp_group(int color, int key) {
  return backend->make_tp_group(mpi, color, key, *device, tp_poll());
}

}  // namespace ppb::run
