// --scenario and its flags (issue 37), typed and checked for parse_run_options: the scenario
// itself by serving::parse_scenario (the parser `plan` and `serve-search` share), what the
// serving engine does not take yet refused here.
#include <string>

#include "common/error.h"
#include "run/options.h"
#include "serving/scheduler.h"

namespace ppb::run {

namespace {

/// The flags the serving engine does not take (yet), each refused with why.
void refuse_unsupported(const RunFlags& f) {
  if (f.plan > 0) throw UserError("--plan ranks layouts by closed batches; it does not take --scenario yet");
  for (const std::string& t : f.tp)
    if (t == "auto")
      throw UserError("--tp auto ranks layouts by closed batches; with --scenario give the widths (--tp 2, --tp 2,1, "
                      "repeated to compare layouts; `ppbench plan --scenario` ranks them by rate)");
  if (f.mtp) throw UserError("--scenario does not run the MTP modules (--mtp) yet");
  if (f.control) throw UserError("--control is a closed-batch A/A check; it does not take --scenario");
  if (f.partition == "adaptive")
    throw UserError("--partition adaptive re-solves from closed-batch rounds; with --scenario use uniform, seed, "
                    "balanced, both, all or a manual split");
  if (f.no_overlap) throw UserError("--no-overlap is a closed-batch A/B; the serving engine always overlaps");
}

}  // namespace

ScenarioOptions parse_scenario_options(const RunFlags& f) {
  serving::ScenarioUse use;
  use.command = serving::ScenarioUse::Command::run;
  use.prompt_len = use.max_prompt_len = f.prompt_len;
  use.gen_len = use.max_gen_len = f.gen_len;
  use.slots = f.batch;
  use.seed = f.seed;
  const std::string& kind = f.scenario.scenario;
  if (kind == "poisson" || kind == "gamma" || kind == "trace") refuse_unsupported(f);
  ScenarioOptions s;
  s.spec = serving::parse_scenario(f.scenario, use);
  if (!s.on()) return s;
  s.drawn = serving::scenario_requests(*s.spec);
  if (s.spec->kind == serving::ArrivalKind::trace) s.spec->requests = static_cast<int>(s.drawn.requests.size());
  // The scheduler's own checks (a KV pool too small for one request) before anything runs.
  // (--kv-blocks auto: per split once the memory is known, run/memory_checks.h auto_kv_blocks.)
  serving::SchedulerConfig check = s.spec->scheduler(1);
  if (check.kv_blocks == serving::kKvBlocksAuto) check.kv_blocks = 0;
  serving::Scheduler(s.drawn.requests, check);
  return s;
}

}  // namespace ppb::run
