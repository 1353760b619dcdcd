// Continuous batching per request group (the model is described in scheduler.h).
#include "serving/scheduler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

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
  if (config_.kv_blocks == kKvBlocksAuto)
    throw InternalError("scheduler: --kv-blocks auto reached a scheduler unresolved (run/memory_checks.h auto_kv_blocks)");
  check_kv_pool(config_.kv_block_size, config_.kv_blocks);
  // A request holds at most the blocks of its prompt_len + gen_len - 1 positions (its last
  // token is not fed back).
  auto blocks_of = [&](int positions) { return (positions + config_.kv_block_size - 1) / config_.kv_block_size; };
  int longest = 0, widest = -1;
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    state_[i].target = requests_[i].prompt_len;
    const int b = blocks_of(requests_[i].prompt_len + requests_[i].gen_len - 1);
    if (b > longest) longest = b, widest = static_cast<int>(i);
  }
  if (config_.kv_blocks > 0 && config_.kv_blocks < longest) {
    const Request& r = requests_[static_cast<std::size_t>(widest)];
    throw UserError("--kv-blocks " + std::to_string(config_.kv_blocks) + ": request " + std::to_string(widest) +
                    " (prompt " + std::to_string(r.prompt_len) + ", output " + std::to_string(r.gen_len) + ") needs " +
                    std::to_string(longest) + " blocks of " + std::to_string(config_.kv_block_size) +
                    " tokens alone and would never finish; valid: >= " + std::to_string(longest) +
                    " (the longest request's), or 0 (every slot at the longest request)");
  }
  pool_blocks_ = config_.kv_blocks > 0 ? config_.kv_blocks : config_.slots * longest;
  const bool shared = config_.pp_schedule == PpSchedule::batch_queue;
  if (shared) pool_blocks_ *= config_.groups;  // M groups' pools in one
  pools_.resize(shared ? 1 : static_cast<std::size_t>(config_.groups));
  for (Pool& p : pools_) {
    p.slot_owner.assign(static_cast<std::size_t>(config_.pool_slots()), -1);
    p.free_blocks = pool_blocks_;
  }
  sent_s_.assign(requests_.size(), 0.0);
  free_permits_.assign(std::min<std::size_t>(static_cast<std::size_t>(config_.max_concurrency), requests_.size()), 0.0);
  groups_.resize(static_cast<std::size_t>(config_.groups));
  for (int g = 0; g < config_.groups; ++g) {
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

int Scheduler::waiting_head(double now_s, bool& preempted) const {
  preempted = !preempted_.empty();
  if (preempted) return preempted_.front();
  if (head_ < fcfs_.size() && at_engine_s(head_) <= now_s) return fcfs_[head_];
  return -1;
}

void Scheduler::admit_to(int g, int slot, int id, double now_s) {
  Group& group = groups_[g];
  pool(g).slot_owner[slot] = id;
  State& s = state_[id];
  if (s.admitted_seq < 0) times_[id].admitted_s = now_s;  // the queue time ends at the first admission
  s.group = g;
  s.slot = slot;
  s.admitted_seq = admitted_++;
  group.step.admitted.push_back(id);
}

int Scheduler::blocks_after(const BatchRow& row) const {
  return (row.position + row.tokens + config_.kv_block_size - 1) / config_.kv_block_size;
}

void Scheduler::take_blocks(int g, const BatchRow& row) {
  State& s = state_[row.request];
  const int need = blocks_after(row) - s.blocks;
  if (need <= 0) return;
  Pool& p = pool(g);
  if (need > p.free_blocks) throw InternalError("scheduler: a row scheduled beyond its group's KV pool");
  p.free_blocks -= need;
  s.blocks += need;
  blocks_peak_ = std::max(blocks_peak_, pool_blocks_ - p.free_blocks);
}

void Scheduler::vacate(int g, int slot) {
  Pool& p = pool(g);
  const int id = p.slot_owner[slot];
  p.free_blocks += state_[id].blocks;
  state_[id].blocks = 0;
  p.slot_owner[slot] = -1;
  p.released.push_back(slot);
}

void Scheduler::preempt(int g, int slot) {
  Pool& p = pool(g);
  const int id = p.slot_owner[slot];
  State& s = state_[id];
  vacate(g, slot);
  // The positions in its KV cache: those prefilled, or once its prefill is done the prompt and
  // every output token but the last (not fed back yet).
  times_[id].preempted_tokens += s.prefilled < s.target ? s.prefilled : requests_[id].prompt_len + s.produced - 1;
  s.target = requests_[id].prompt_len + s.produced;  // recompute: the prompt and the tokens out so far
  s.prefilled = 0;
  ++times_[id].preemptions;
  ++preemptions_;
  preempted_.push_front(id);  // V1: waiting.prepend_request
}

bool Scheduler::schedule_running(int g, int& budget) {
  // vLLM V1 (vllm/v1/core/sched/scheduler.py `schedule`): the running requests in the order they
  // were admitted, each its next row (a decode 1 token, a prompt still being prefilled its next
  // chunk); when the pool cannot cover a row, `self.running.pop()`: the request admitted last is
  // preempted, until the row fits or the request itself was the one preempted.
  Group& group = groups_[g];
  Pool& p = pool(g);
  std::vector<int> order;  // the pool's slots by admission; none in flight (batch_queue: in another batch)
  for (int slot = 0; slot < config_.pool_slots(); ++slot)
    if (p.slot_owner[slot] != -1 && !state_[p.slot_owner[slot]].in_flight) order.push_back(slot);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return state_[p.slot_owner[a]].admitted_seq < state_[p.slot_owner[b]].admitted_seq;
  });
  bool preempted = false;
  std::size_t end = order.size();
  for (std::size_t i = 0; i < end && budget > 0; ++i) {
    const int slot = order[i];
    const BatchRow row = row_of(p.slot_owner[slot], slot, budget);
    bool self = false;
    while (blocks_after(row) - state_[row.request].blocks > p.free_blocks) {
      const int victim = order[--end];
      preempt(g, victim);
      preempted = true;
      if (victim == slot) {
        self = true;
        break;
      }
    }
    if (self) break;
    take_blocks(g, row);
    budget -= row.tokens;
    group.step.rows.push_back(row);
  }
  return preempted;
}

void Scheduler::admit_waiting(int g, double now_s, int& budget) {
  Group& group = groups_[g];
  Pool& p = pool(g);
  send(now_s);
  for (int slot = 0; slot < config_.pool_slots() && budget > 0; ++slot) {
    if (p.slot_owner[slot] != -1) continue;
    bool was_preempted = false;
    const int id = waiting_head(now_s, was_preempted);
    if (id < 0) break;
    const BatchRow row = row_of(id, slot, budget);
    if (blocks_after(row) > p.free_blocks) break;  // V1: the head waits for blocks; FCFS holds the rest
    if (was_preempted)
      preempted_.pop_front();
    else
      ++head_;
    admit_to(g, slot, id, now_s);
    take_blocks(g, row);
    budget -= row.tokens;
    group.step.rows.push_back(row);
  }
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
  group.step.released.clear();
  // mixed and prefill_first prefill whole prompts: no budget.
  int budget = config_.policy == StepPolicy::vllm_v1 ? config_.max_batched_tokens : std::numeric_limits<int>::max();
  if (config_.policy == StepPolicy::prefill_first) {
    // V0 (vllm/core/scheduler.py `_schedule_default`): the waiting prompts first; the running
    // requests only in a step that admitted none ("Don't schedule decodes if prefills are
    // scheduled").
    admit_waiting(g, now_s, budget);
    if (group.step.admitted.empty()) schedule_running(g, budget);
  } else if (!schedule_running(g, budget)) {
    admit_waiting(g, now_s, budget);  // V1: no waiting request joins a step that preempted
  }
  std::sort(group.step.rows.begin(), group.step.rows.end(),
            [](const BatchRow& a, const BatchRow& b) { return a.slot < b.slot; });
  for (const BatchRow& row : group.step.rows) state_[row.request].in_flight = true;
  group.in_flight = !group.step.rows.empty();
  if (group.in_flight) std::swap(group.step.released, pool(g).released);  // pool's now empty
  return group.step;
}

BatchRow Scheduler::row_of(int id, int slot, int budget) const {
  const State& s = state_[id];
  BatchRow row;
  row.request = id;
  row.slot = slot;
  row.prefill = s.prefilled < s.target;
  row.position = row.prefill ? s.prefilled : requests_[id].prompt_len + s.produced - 1;
  row.tokens = row.prefill ? std::min(s.target - s.prefilled, budget) : 1;
  row.emits = !row.prefill || s.prefilled + row.tokens == s.target;
  return row;
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
    s.in_flight = false;
    if (row.prefill) s.prefilled += row.tokens;
    if (!row.emits) continue;  // a chunk before the prompt's last: no token yet
    ++s.produced;
    t.token_s.push_back(end_s);
    if (s.produced == 1) t.first_token_s = end_s;
    if (s.produced == requests_[row.request].gen_len) {
      t.finish_s = end_s;
      s.finished = true;
      ++finished_;
      vacate(g, row.slot);
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
  int n = static_cast<int>(preempted_.size());
  for (std::size_t i = head_; i < fcfs_.size() && at_engine_s(i) <= now_s; ++i) ++n;
  return n;
}

int Scheduler::running(int g) const {
  if (g < 0 || g >= config_.groups) throw InternalError("scheduler: group " + std::to_string(g) + " out of range");
  const auto& owners = pool(g).slot_owner;
  return static_cast<int>(std::count_if(owners.begin(), owners.end(), [](int id) { return id != -1; }));
}

void check_kv_pool(int kv_block_size, int kv_blocks) {
  if (kv_block_size < 1)
    throw UserError("--kv-block-size " + std::to_string(kv_block_size) + ": tokens per KV block, >= 1 "
                    "(vLLM's --block-size; 16 by default)");
  if (kv_blocks < 0)
    throw UserError("--kv-blocks " + std::to_string(kv_blocks) + ": blocks in each group's KV pool, >= 1 "
                    "(0: every slot at the longest request)");
}

int parse_kv_blocks(const std::string& text, bool allow_auto) {
  if (text == "auto") {
    if (allow_auto) return kKvBlocksAuto;
    throw UserError("--kv-blocks auto sizes each split's pool from its stages' free memory, which only `ppbench run` "
                    "knows; give a number of blocks here (a run's file has the pool it chose as kv_blocks of "
                    "/benchmark/<name>)");
  }
  std::size_t used = 0;
  long long n = -1;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || n < 0 || n > std::numeric_limits<int>::max())
    throw UserError("--kv-blocks " + text + ": blocks in each group's KV pool, an integer >= 0 (0: every slot at the "
                    "longest request)" + (allow_auto ? ", or auto (sized from the stages' free memory)" : ""));
  return static_cast<int>(n);
}

int max_step_tokens(const std::vector<Request>& requests, const SchedulerConfig& config) {
  int row = 1;
  for (const Request& r : requests)
    row = std::max(row, config.kv_blocks != 0 ? r.prompt_len + r.gen_len - 1 : r.prompt_len);
  return config.pool_slots() * row;
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

const char* pp_schedule_name(PpSchedule s) { return s == PpSchedule::batch_queue ? "batch-queue" : "groups"; }

PpSchedule parse_pp_schedule(const std::string& text, const std::string& where) {
  if (text == "groups") return PpSchedule::groups;
  if (text == "batch-queue") return PpSchedule::batch_queue;
  throw UserError(where + " '" + text + "' is unknown; valid: groups (M pinned batches of B slots, each its own KV "
                  "pool: vLLM V0's virtual engines), batch-queue (one scheduler and KV pool over M x B slots, up to M "
                  "batches in flight: vLLM V1 under pipeline parallelism)");
}

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
