// Continuous batching per request group (issue 37's engine), as a pure, discrete model: which
// requests each step of each group runs, at which positions, and when each request's tokens
// came out. It owns no clock: the caller says when a group's step starts (next_step) and when
// it ended (complete_step), so the real pipeline (times measured) and a simulator (times
// predicted) drive the same schedule.
//
// The model:
//  - M groups, each an independent batch with B slots (a slot = one row of the group's KV
//    cache), as vLLM's virtual engines under pipeline parallelism are (one scheduler and KV
//    cache per virtual engine, vllm/engine/llm_engine.py).
//  - One FCFS queue of arrived requests, shared by the groups: when a group forms its next step
//    at time t, it admits from the head of the queue the requests that arrived at or before t,
//    into its free slots (lowest slot first), until the head has not arrived yet or the group
//    has no free slot. So a waiting request goes to the group whose next step starts first
//    (work-conserving; requests are admitted strictly in arrival order, ties by index). vLLM V0
//    instead binds a request, on arrival, to the virtual engine with the fewest unfinished
//    requests, where it waits even if another engine frees a slot first.
//  - A step: every admitted request is prefilled whole in that step (vllm_v1: in chunks; its
//    prompt_len tokens at positions 0..prompt_len-1, giving its first output token) and every running request
//    decodes one token at its own position (prompt_len + tokens out so far - 1). StepPolicy
//    says whether both kinds share a step:
//      mixed (default): yes. This is iteration-level scheduling (Orca, OSDI'22) and what vLLM
//        V1's scheduler does (running requests first, then waiting ones, under one token
//        budget; vllm/v1/core/sched/scheduler.py) when --max-num-batched-tokens is large
//        enough that no prompt is chunked (vllm_v1 below has the budget).
//      vllm_v1: vLLM V1 with chunked prefill: under a token budget per step
//        (max_batched_tokens, vLLM's --max-num-batched-tokens), the running requests first in
//        the order they were admitted (a decode 1 token; a prompt still being prefilled its next
//        chunk), then waiting requests FCFS into free slots with as much of their prompt as the
//        budget leaves. A prompt may span steps; its first token comes with its last chunk.
//      prefill_first: vLLM V0's default scheduler (vllm/core/scheduler.py `_schedule_default`,
//        chunked prefill off): "Don't schedule decodes if prefills are scheduled": a step that
//        admits any request runs only those prefills; the running requests wait for the next
//        step. (V0's prefill token budget is not modelled: every arrived request that has a
//        slot is admitted.)
//  - KV memory in blocks, as vLLM's paged engines hold it (vllm/v1/core/kv_cache_manager.py):
//    each group has a pool of kv_blocks blocks of kv_block_size tokens; a row's step needs the
//    blocks that cover its positions [0, position + tokens), taken from the pool when the step
//    is formed and given back when its request leaves. The running requests are scheduled
//    first, in the order they were admitted; when the pool cannot cover one, the running
//    request admitted last is preempted (vLLM V1's policy: preemption by recompute, the
//    lowest-priority request of the running list first, possibly the one being scheduled): its
//    blocks and slot are freed, and it goes to the front of the waiting queue; readmitted, it
//    prefills its prompt and the tokens it had produced (prompt_len + out tokens at positions 0..,
//    chunked under vllm_v1's budget) and its last chunk gives its next token. A step that
//    preempted admits no waiting request (V1: `if not preempted_reqs`); a waiting request is
//    admitted only when the pool covers its (first chunk of) prefill, else admission stops there
//    (FCFS). prefill_first (V0) admits first and schedules the running requests only in a step
//    that admitted none. With kv_blocks = 0 the pool holds every slot at the longest request's
//    length: nothing is preempted and the schedule is as without a pool.
//  - A request leaves when its gen_len-th output token comes out (the prefill gives the first,
//    each decode one more): its slot and its blocks are free for the group's next step.
//  - A group has at most one step in flight (a pipeline's group waits for its token before its
//    next step).
//  - PpSchedule batch_queue (vLLM V1 under pipeline parallelism: one scheduler, its batch queue
//    of max_concurrent_batches = M): the groups are M batches in flight over one pool of M x B
//    slots and M x kv_blocks blocks; a batch formed takes every running request that has no row
//    in flight (a request waits for its token before its next row, so batches hold disjoint
//    requests), in admission order, then admits waiting ones into any free slot; a preemption
//    takes the last-admitted running request not in flight. A request is not pinned to a group.
#pragma once

#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "serving/arrivals.h"
#include "serving/request_metrics.h"

namespace ppb::serving {

enum class StepPolicy { mixed, prefill_first, vllm_v1 };

/// How the M steps in flight share the requests: `groups` (M pinned batches of B slots, each its
/// own KV pool: vLLM V0's virtual engines) or `batch_queue` (vLLM V1 under pipeline parallelism:
/// one scheduler over M x B slots and one KV pool of M x kv_blocks, up to M batches in flight;
/// a batch takes every running request not in flight and admits into any free slot).
enum class PpSchedule { groups, batch_queue };

/// "groups" or "batch-queue" (the flag's value, the file's pp_schedule).
const char* pp_schedule_name(PpSchedule s);

/// The schedule named `text` ("groups", "batch-queue"). @throws ppb::UserError naming `where`,
/// the text and both valid names otherwise.
PpSchedule parse_pp_schedule(const std::string& text, const std::string& where = "--pp-schedule");

/// A step policy's name: "mixed" or "prefill-first" (the flag's value, the file's step_policy).
const char* step_policy_name(StepPolicy p);

/// The policies with what each does, for help and error texts: "mixed (...), prefill-first (...)".
std::string step_policy_choices();

/// The policy named `text`. @throws ppb::UserError naming `where` (the flag, or the file's
/// attribute that held it), the text and every valid name otherwise.
StepPolicy parse_step_policy(const std::string& text, const std::string& where = "--step-policy");

struct SchedulerConfig {
  int groups = 1;  ///< M: independent batches (virtual engines), >= 1
  int slots = 1;   ///< B: requests per group at once (KV-cache rows), >= 1
  StepPolicy policy = StepPolicy::mixed;
  /// The client's limit on requests in flight (`vllm bench serve --max-concurrency`; 0: none): a
  /// request is sent when it has arrived and one of the limit's permits is free (a FIFO
  /// semaphore, released when a request finishes); its times, TTFT included, count from when it
  /// was sent, as vLLM's client times them after its semaphore.
  int max_concurrency = 0;
  /// vllm_v1: the tokens a step runs at most (vLLM's --max-num-batched-tokens), >= 1.
  int max_batched_tokens = 2048;
  /// Tokens per KV block (vLLM's --block-size; 16 by default), >= 1.
  int kv_block_size = 16;
  /// Blocks in each group's KV pool; 0: every slot at the longest request (nothing binds). A
  /// pool smaller than one request's positions (prompt_len + gen_len - 1) is refused.
  int kv_blocks = 0;
  /// groups, or batch_queue: the M groups are M batches in flight over one pool of M x `slots`
  /// slots (a row's slot in [0, M x slots)) and M x kv_blocks blocks.
  PpSchedule pp_schedule = PpSchedule::groups;
  /// KV-cache slots of one pool: `slots`, or M x `slots` with batch_queue.
  int pool_slots() const { return pp_schedule == PpSchedule::batch_queue ? groups * slots : slots; }
};

/// Checks --kv-block-size (>= 1) and --kv-blocks (>= 0). @throws ppb::UserError naming the flag,
/// its value and what is valid. The scheduler's constructor and the scenario's parser both call it.
void check_kv_pool(int kv_block_size, int kv_blocks);

/// ScenarioSpec::kv_blocks of `--kv-blocks auto`: `run` resolves it per split, before any
/// SchedulerConfig reaches a Scheduler (which refuses it).
inline constexpr int kKvBlocksAuto = -1;

/// The text of --kv-blocks: a count >= 0, or "auto" (kKvBlocksAuto) where `allow_auto`.
/// @throws ppb::UserError naming the flag, its text and what is valid.
int parse_kv_blocks(const std::string& text, bool allow_auto);

/// The most tokens one step of `config` can run over `requests`: pool_slots() rows of the longest prompt
/// (the longest prompt + output - 1 where a bounded KV pool may preempt: a readmitted request
/// prefills its tokens so far). vllm_v1's budget is not applied: a warm-up step (B whole
/// prompts) is sized by it too. For sizing a stage's step buffers.
int max_step_tokens(const std::vector<Request>& requests, const SchedulerConfig& config);

/// One row of a step's ragged batch: a request and the tokens it runs.
struct BatchRow {
  int request = -1;   ///< index into the scheduler's request list
  int slot = -1;      ///< its KV-cache row in its pool, 0..pool_slots()-1
  /// Position of this row's first token: a prefill's first (0, or a chunk's start under
  /// vllm_v1); a decode's prompt_len + k - 1.
  int position = 0;
  int tokens = 0;     ///< tokens this step: the prompt or a chunk of it (prefill), 1 (decode)
  bool prefill = false;
  /// The step gives the request a token: a decode, or the prefill of its prompt's last tokens
  /// (a vllm_v1 chunk before the last gives none).
  bool emits = true;
};

/// What a group runs in one step.
struct Step {
  int group = -1;
  double start_s = 0.0;        ///< when it was formed (the caller's now)
  std::vector<int> admitted;   ///< requests admitted at this step, in FCFS order
  std::vector<BatchRow> rows;  ///< ordered by slot; empty: nothing to run
  /// Slots of the step's pool whose request left (finished or was preempted) since the pool's
  /// previous step with rows was formed, in the order they were freed: their KV positions are
  /// free before this step's rows run (RaggedStep::released; a demand-paged store gives their
  /// pages back). A step without rows carries none: they wait for the next one.
  std::vector<int> released;
  /// Tokens the stages process in this step: sum of rows' tokens.
  int total_tokens() const;
};

class Scheduler {
 public:
  /// `requests` on the caller's clock (arrival_s, seconds). Throws ppb::UserError naming
  /// -M/--microbatches or -b/--batch when groups or slots < 1, and on a request with
  /// prompt_len or gen_len < 1 or a non-finite or negative arrival.
  Scheduler(std::vector<Request> requests, SchedulerConfig config);

  /// Forms group g's next step at the caller's time now_s (s): admissions (above), then the
  /// ragged batch. A step with rows is in flight until complete_step(g); one without rows (the
  /// group has nothing running and nothing arrived to admit) is not: call again later, e.g. at
  /// next_arrival_s(). The reference is valid until the next call for g.
  /// Throws ppb::InternalError if g is out of range, has a step in flight, or now_s is before
  /// the end of its previous step.
  const Step& next_step(int g, double now_s);

  /// Group g's step in flight ended at end_s (s, >= its start): each row's request gets an
  /// output token at end_s; a request with its gen_len tokens finishes and frees its slot.
  /// Throws ppb::InternalError if g has no step in flight or end_s < its start.
  void complete_step(int g, double end_s);

  bool in_flight(int g) const;
  /// Every request finished.
  bool finished() const { return finished_ == static_cast<int>(requests_.size()); }
  /// When the first request not yet admitted reaches the engine (its arrival, or with
  /// max_concurrency its send); +inf when none is left or the next waits for a request to finish.
  double next_arrival_s() const;
  /// Requests at the engine by now_s (arrived, and sent) and not yet admitted.
  int waiting(double now_s) const;
  /// Requests holding a slot of group g's pool (with batch_queue: of the one pool).
  int running(int g) const;

  const std::vector<Request>& requests() const { return requests_; }
  /// Per request, its times so far (valid in full once it finished; shape [N]).
  const std::vector<RequestTimes>& times() const { return times_; }
  /// Group and slot each request was last admitted to (-1 before admission).
  int group_of(int request) const { return state_.at(request).group; }
  int slot_of(int request) const { return state_.at(request).slot; }
  /// Preemptions so far, over every request (each request's: times()[q].preemptions).
  int preemptions() const { return preemptions_; }
  /// Blocks of each group's KV pool (config's kv_blocks, or what kv_blocks = 0 means), and the
  /// most any group held at once so far.
  int kv_pool_blocks() const { return pool_blocks_; }
  int kv_blocks_peak() const { return blocks_peak_; }

 private:
  struct State {
    int group = -1, slot = -1;
    bool in_flight = false;  ///< a row of it is in a step in flight (batch_queue skips it)
    /// Tokens to prefill before its next token: prompt_len, or after a preemption prompt_len +
    /// the tokens produced by then (recompute).
    int target = 0;
    int prefilled = 0;      ///< of target, prefilled so far (vllm_v1 chunks them)
    int produced = 0;       ///< output tokens out so far
    int blocks = 0;         ///< KV blocks it holds in its group's pool
    int admitted_seq = -1;  ///< its place in the order of (re)admission
    bool finished = false;
  };
  /// KV slots and blocks: one per group, or one for all with batch_queue.
  struct Pool {
    std::vector<int> slot_owner;  ///< request per slot, -1 free
    int free_blocks = 0;
    std::vector<int> released;    ///< slots freed since its last step with rows (Step::released)
  };
  struct Group {
    bool in_flight = false;
    double last_end_s = -std::numeric_limits<double>::infinity();
    Step step;
  };
  /// The running requests of group g, in admission order, each its next row under the budget
  /// and the pool, preempting from the back (header). Returns whether it preempted.
  bool schedule_running(int g, int& budget);
  /// Waiting requests (the preempted first, then the FCFS queue's arrived ones) into group g's
  /// free slots while the budget and the pool cover their first row.
  void admit_waiting(int g, double now_s, int& budget);
  /// The next waiting request at the engine by now_s (-1: none), and whether it was preempted.
  int waiting_head(double now_s, bool& preempted) const;
  /// Request `id` into group g's free `slot` at now_s, running `row` (its first).
  void admit_to(int g, int slot, int id, double now_s);
  /// Preempts the request in group g's `slot` (recompute): its blocks and slot freed, it waits
  /// at the front of the queue.
  void preempt(int g, int slot);
  /// The row request `id` in `slot` runs next with at most `budget` (>= 1) tokens.
  BatchRow row_of(int id, int slot, int budget) const;
  /// Blocks a request holds once `row` ran: those covering positions [0, position + tokens).
  int blocks_after(const BatchRow& row) const;
  /// Takes the blocks `row` needs beyond what its request holds from group g's pool.
  void take_blocks(int g, const BatchRow& row);
  /// Group g's pool takes `slot` back from its request (finished or preempted): its blocks freed,
  /// the slot free, and released (Step::released of the pool's next step with rows).
  void vacate(int g, int slot);
  /// With max_concurrency: sends the requests (in FCFS order) whose permit is free by now_s.
  void send(double now_s);
  /// When request fcfs_[i] reaches the engine (sent_s_ once sent, else its arrival); +inf while
  /// it waits for a permit that no finished request has freed yet.
  double at_engine_s(std::size_t i) const;

  std::vector<Request> requests_;
  SchedulerConfig config_;
  std::vector<int> fcfs_;  ///< request indices by (arrival_s, index)
  std::size_t head_ = 0;   ///< first of fcfs_ not admitted
  std::size_t sent_ = 0;   ///< with max_concurrency: the first of fcfs_ not sent
  std::vector<double> sent_s_;  ///< [N] by request: when it was sent (max_concurrency)
  /// With max_concurrency: when each free permit became free (a min-heap; N permits free at 0).
  std::vector<double> free_permits_;
  std::vector<State> state_;
  std::vector<RequestTimes> times_;
  std::vector<Group> groups_;
  std::vector<Pool> pools_;
  /// Group g's pool.
  Pool& pool(int g) { return pools_[config_.pp_schedule == PpSchedule::batch_queue ? 0 : g]; }
  const Pool& pool(int g) const { return pools_[config_.pp_schedule == PpSchedule::batch_queue ? 0 : g]; }
  std::deque<int> preempted_;  ///< preempted requests waiting, the front first (before fcfs_'s head)
  int finished_ = 0;
  int admitted_ = 0;  ///< admissions so far (State::admitted_seq)
  int preemptions_ = 0;
  int pool_blocks_ = 0, blocks_peak_ = 0;
};

}  // namespace ppb::serving
