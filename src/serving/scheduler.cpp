// Continuous batching per request group (the model is described in scheduler.h).
#include "serving/scheduler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>

#include "common/error.h"

namespace ppb::serving {

int Step::total_tokens() const {
  int n = 0;
  for (const BatchRow& r : rows) n += r.tokens;
  return n;
}

Scheduler::Scheduler(std::vector<Request> requests, SchedulerConfig config)
    : requests_(std::move(requests)), config_(config) {
  if (config_.groups < 1)
    throw UserError("-M/--microbatches " + std::to_string(config_.groups) +
                    ": the serving scenario needs at least 1 group");
  if (config_.slots < 1)
    throw UserError("-b/--batch " + std::to_string(config_.slots) +
                    ": the serving scenario needs at least 1 slot per group");
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    const Request& r = requests_[i];
    if (r.prompt_len < 1 || r.gen_len < 1 || !std::isfinite(r.arrival_s) || r.arrival_s < 0.0)
      throw UserError("request " + std::to_string(i) + ": prompt_len " +
                      std::to_string(r.prompt_len) + ", gen_len " + std::to_string(r.gen_len) +
                      ", arrival " + std::to_string(r.arrival_s) +
                      " s: lengths must be >= 1 and the arrival a time >= 0");
  }
  fcfs_.resize(requests_.size());
  std::iota(fcfs_.begin(), fcfs_.end(), 0);
  std::stable_sort(fcfs_.begin(), fcfs_.end(), [this](int a, int b) {
    return requests_[a].arrival_s < requests_[b].arrival_s;
  });
  state_.resize(requests_.size());
  times_.resize(requests_.size());
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    times_[i].arrival_s = requests_[i].arrival_s;
    times_[i].prompt_len = requests_[i].prompt_len;
    times_[i].gen_len = requests_[i].gen_len;
  }
  if (config_.policy == StepPolicy::vllm_v1 && config_.max_batched_tokens < 1)
    throw UserError("--max-batched-tokens " + std::to_string(config_.max_batched_tokens) + ": the tokens a step runs at "
                    "most, >= 1 (vLLM's --max-num-batched-tokens; 2048 by default)");
  if (config_.max_concurrency < 0)
    throw UserError("--max-concurrency " + std::to_string(config_.max_concurrency) + ": requests in flight at most, "
                    ">= 1 (0: no limit)");
  sent_s_.assign(requests_.size(), 0.0);
  free_permits_.assign(std::min<std::size_t>(static_cast<std::size_t>(config_.max_concurrency), requests_.size()), 0.0);
  groups_.resize(static_cast<std::size_t>(config_.groups));
  for (int g = 0; g < config_.groups; ++g) {
    groups_[g].slot_owner.assign(static_cast<std::size_t>(config_.slots), -1);
    groups_[g].step.group = g;
  }
}

double Scheduler::at_engine_s(std::size_t i) const {
  const int id = fcfs_[i];
  if (config_.max_concurrency == 0) return requests_[id].arrival_s;
  if (i < sent_) return sent_s_[id];
  // The next to send (i == sent_) takes the earliest free permit; a later one waits for it.
  if (i == sent_ && !free_permits_.empty()) return std::max(requests_[id].arrival_s, free_permits_.front());
  return std::numeric_limits<double>::infinity();
}

void Scheduler::send(double now_s) {
  if (config_.max_concurrency == 0) return;
  const auto later = std::greater<double>();
  while (sent_ < fcfs_.size() && !free_permits_.empty()) {
    const int id = fcfs_[sent_];
    const double at = std::max(requests_[id].arrival_s, free_permits_.front());
    if (at > now_s) break;
    std::pop_heap(free_permits_.begin(), free_permits_.end(), later);
    free_permits_.pop_back();
    sent_s_[id] = at;
    times_[id].arrival_s = at;  // TTFT and E2E from the send, as vLLM's client times them
    ++sent_;
  }
}

void Scheduler::admit(int g, double now_s) {
  Group& group = groups_[g];
  send(now_s);
  for (int slot = 0; slot < config_.slots && head_ < fcfs_.size(); ++slot) {
    if (group.slot_owner[slot] != -1) continue;
    const int id = fcfs_[head_];
    if (at_engine_s(head_) > now_s) break;
    admit_to(g, slot, id, now_s);
  }
}

void Scheduler::admit_to(int g, int slot, int id, double now_s) {
  Group& group = groups_[g];
  ++head_;
  group.slot_owner[slot] = id;
  state_[id].group = g;
  state_[id].slot = slot;
  state_[id].admitted_seq = admitted_++;
  times_[id].admitted_s = now_s;
  group.step.admitted.push_back(id);
}

const Step& Scheduler::next_step(int g, double now_s) {
  if (g < 0 || g >= config_.groups)
    throw InternalError("scheduler: group " + std::to_string(g) + " out of range");
  Group& group = groups_[g];
  if (group.in_flight)
    throw InternalError("scheduler: group " + std::to_string(g) + " already has a step in flight");
  if (!(now_s >= group.last_end_s))
    throw InternalError("scheduler: group " + std::to_string(g) + "'s step at " +
                        std::to_string(now_s) + " s starts before its previous one ended");
  group.step.start_s = now_s;
  group.step.admitted.clear();
  group.step.rows.clear();
  if (config_.policy == StepPolicy::vllm_v1) {
    budget_step(g, now_s);
    group.in_flight = !group.step.rows.empty();
    return group.step;
  }
  admit(g, now_s);
  const bool prefill_only =
      config_.policy == StepPolicy::prefill_first && !group.step.admitted.empty();
  for (int slot = 0; slot < config_.slots; ++slot) {
    const int id = group.slot_owner[slot];
    if (id == -1) continue;
    const int produced = state_[id].produced;
    const bool prefill = state_[id].prefilled < requests_[id].prompt_len;
    if (prefill_only && !prefill) continue;  // V0: decodes wait out a prefill step
    BatchRow row;
    row.request = id;
    row.slot = slot;
    row.prefill = prefill;
    row.position = prefill ? 0 : requests_[id].prompt_len + produced - 1;
    row.tokens = prefill ? requests_[id].prompt_len : 1;
    group.step.rows.push_back(row);
  }
  group.in_flight = !group.step.rows.empty();
  return group.step;
}

BatchRow Scheduler::row_of(int id, int slot, int budget) const {
  const State& s = state_[id];
  const int prompt = requests_[id].prompt_len;
  BatchRow row;
  row.request = id;
  row.slot = slot;
  row.prefill = s.prefilled < prompt;
  row.position = row.prefill ? s.prefilled : prompt + s.produced - 1;
  row.tokens = row.prefill ? std::min(prompt - s.prefilled, budget) : 1;
  row.emits = !row.prefill || s.prefilled + row.tokens == prompt;
  return row;
}

void Scheduler::budget_step(int g, double now_s) {
  // vLLM V1 (vllm/v1/core/sched/scheduler.py `schedule`): the running requests first, in the
  // order they were admitted (a decode is 1 token, a prompt still being prefilled its next chunk),
  // then the waiting ones, FCFS, into free slots, each with as much of its prompt as the budget
  // leaves; a request the budget does not reach waits for the group's next step.
  Group& group = groups_[g];
  int budget = config_.max_batched_tokens;
  std::vector<int> order;  // the group's slots by admission
  for (int slot = 0; slot < config_.slots; ++slot)
    if (group.slot_owner[slot] != -1) order.push_back(slot);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return state_[group.slot_owner[a]].admitted_seq < state_[group.slot_owner[b]].admitted_seq;
  });
  for (int slot : order) {
    if (budget == 0) break;
    const BatchRow row = row_of(group.slot_owner[slot], slot, budget);
    budget -= row.tokens;
    group.step.rows.push_back(row);
  }
  send(now_s);
  for (int slot = 0; slot < config_.slots && head_ < fcfs_.size() && budget > 0; ++slot) {
    if (group.slot_owner[slot] != -1) continue;
    const int id = fcfs_[head_];
    if (at_engine_s(head_) > now_s) break;
    admit_to(g, slot, id, now_s);
    const BatchRow row = row_of(id, slot, budget);
    budget -= row.tokens;
    group.step.rows.push_back(row);
  }
  std::sort(group.step.rows.begin(), group.step.rows.end(),
            [](const BatchRow& a, const BatchRow& b) { return a.slot < b.slot; });
}

void Scheduler::complete_step(int g, double end_s) {
  if (g < 0 || g >= config_.groups || !groups_[g].in_flight)
    throw InternalError("scheduler: group " + std::to_string(g) + " has no step in flight");
  Group& group = groups_[g];
  if (!(end_s >= group.step.start_s))
    throw InternalError("scheduler: group " + std::to_string(g) + "'s step ends at " +
                        std::to_string(end_s) + " s, before it started");
  for (const BatchRow& row : group.step.rows) {
    State& s = state_[row.request];
    RequestTimes& t = times_[row.request];
    if (row.prefill) s.prefilled += row.tokens;
    if (!row.emits) continue;  // a chunk before the prompt's last: no token yet
    ++s.produced;
    t.token_s.push_back(end_s);
    if (row.prefill) t.first_token_s = end_s;
    if (s.produced == requests_[row.request].gen_len) {
      t.finish_s = end_s;
      s.finished = true;
      ++finished_;
      group.slot_owner[row.slot] = -1;
      if (config_.max_concurrency > 0) {  // its permit is free again
        free_permits_.push_back(end_s);
        std::push_heap(free_permits_.begin(), free_permits_.end(), std::greater<double>());
      }
    }
  }
  group.in_flight = false;
  group.last_end_s = end_s;
}

bool Scheduler::in_flight(int g) const { return groups_.at(g).in_flight; }

double Scheduler::next_arrival_s() const {
  return head_ < fcfs_.size() ? at_engine_s(head_) : std::numeric_limits<double>::infinity();
}

int Scheduler::waiting(double now_s) const {
  int n = 0;
  for (std::size_t i = head_; i < fcfs_.size() && at_engine_s(i) <= now_s; ++i) ++n;
  return n;
}

int Scheduler::running(int g) const {
  const auto& owners = groups_.at(g).slot_owner;
  return static_cast<int>(std::count_if(owners.begin(), owners.end(), [](int id) { return id != -1; }));
}

namespace {

/// Every step policy: its name (the flag's value, the file's step_policy) and what it does. A
/// new policy is a row here and a case in Scheduler::next_step.
struct StepPolicyRow {
  StepPolicy policy;
  const char* name;
  const char* what;
};
constexpr StepPolicyRow kStepPolicies[] = {
    {StepPolicy::mixed, "mixed", "prefills join decodes in one step, vLLM V1"},
    {StepPolicy::prefill_first, "prefill-first", "a step with prefills runs only them, vLLM V0"},
    {StepPolicy::vllm_v1, "vllm-v1",
     "running requests first (decodes, prompts being chunked), then waiting prompts, chunked, under "
     "--max-batched-tokens: vLLM V1 with chunked prefill"},
};

}  // namespace

std::string step_policy_choices() {
  std::string out;
  for (const StepPolicyRow& r : kStepPolicies) out += (out.empty() ? "" : ", ") + std::string(r.name) + " (" + r.what + ")";
  return out;
}

const char* step_policy_name(StepPolicy p) {
  for (const StepPolicyRow& r : kStepPolicies)
    if (r.policy == p) return r.name;
  throw InternalError("step_policy_name: a policy without a row in kStepPolicies");
}

StepPolicy parse_step_policy(const std::string& text, const std::string& where) {
  for (const StepPolicyRow& r : kStepPolicies)
    if (text == r.name) return r.policy;
  throw UserError(where + " '" + text + "' is unknown; valid: " + step_policy_choices());
}

}  // namespace ppb::serving
