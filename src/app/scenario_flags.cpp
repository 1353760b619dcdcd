#include "app/scenario_flags.h"

#include <string>

namespace ppb {

namespace {

using Command = serving::ScenarioUse::Command;

/// --scenario's help for each command.
std::string scenario_help(Command c) {
  if (c == Command::run)
    return "closed | poisson | gamma | trace. closed: M groups of B sequences of -p prompt and -g output tokens, "
           "all starting at once (every figure but the serving ones). The others: requests that arrive "
           "(--request-rate, --burstiness, --requests, --prompt-lens, --gen-lens, or --trace), served with "
           "continuous batching by the M groups in flight, each an independent batch of B slots (vLLM's virtual "
           "engines): a request waits FCFS for a free slot, is prefilled whole in its group's next step "
           "beside the running requests' decodes, and leaves at its own output length. Per-request TTFT, TPOT, "
           "ITL, E2E, goodput; every split under the same arrivals in interleaved rounds. -p and -g become "
           "the longest prompt and output a request may have; the profile and balancer take the scenario's "
           "mean request, the memory check every slot at the longest";
  if (c == Command::plan)
    return "closed | poisson | gamma. closed (default): the closed-batch front. poisson | gamma: requests that "
           "arrive; every layout ranked by the highest request rate at which --attainment of the requests meet "
           "both --slo-ttft and --slo-tpot (each request's TTFT and TPOT, not the p50), by bisection on the "
           "serving simulator (as serve-search)";
  return "poisson | gamma: the arrival process of the simulated requests (default poisson; --burstiness K alone "
         "means gamma)";
}

}  // namespace

void add_scenario_flags(CLI::App& cmd, serving::ScenarioFlags& f, Command c) {
  const bool run = c == Command::run;
  const std::string when = c == Command::plan ? "--scenario: " : "";
  cmd.add_option("--scenario", f.scenario, scenario_help(c));
  if (run) {
    cmd.add_option("--request-rate", f.request_rate,
                   "R: requests per second of poisson and gamma (inf: every request at t = 0); the arrival times are "
                   "vLLM's (Gamma gaps, rescaled so that the last arrival is at N / R). search: the highest rate that "
                   "meets the TTFT and TPOT limits for --attainment of the requests, predicted by the serving "
                   "simulator (calibrated by one pilot round at the profile's prediction, or at N / --max-time if "
                   "higher) and measured at 0.9x and 1.1x that rate to confirm it");
    cmd.add_option("--trace", f.trace,
                   "--scenario trace: a CSV of arrival_s,prompt_len,gen_len, or an Azure LLM inference trace "
                   "(2023/2024: TIMESTAMP,ContextTokens,GeneratedTokens), a BurstGPT CSV (Timestamp, Request "
                   "tokens, Response tokens, ...; rows of 0 response tokens dropped, as vLLM does) or Mooncake's JSON "
                   "lines (timestamp ms, input_length, output_length, hash_ids: the prefix blocks counted, not "
                   "modelled), as published; lengths clamped to -p and -g");
    cmd.add_option("--trace-speedup", f.trace_speedup,
                   "X: the trace's arrivals X times as fast (its times divided by X): a production trace at a "
                   "testbed's rate")
        ->capture_default_str();
    cmd.add_option("--trace-window", f.trace_window,
                   "START:END: only the trace's requests arriving in [START, END) s of its own clock (from its first "
                   "row; END may be left out), replayed from START");
  }
  cmd.add_option("--requests", f.requests,
                 when + "N requests per scenario (default " +
                     (run ? "64" : c == Command::plan ? "256" : "1000") + ")");
  cmd.add_option("--prompt-lens", f.prompt_lens,
                 when + "prompt lengths: fixed:n | uniform:a,b | lognormal:median,sigma" +
                     (run ? ", clamped to [1, -p] (default fixed:P)" : " (default fixed:P of the file)"));
  cmd.add_option("--gen-lens", f.gen_lens,
                 when + "output lengths (the first token, from the prefill, included), same forms" +
                     (run ? ", clamped to [1, -g] (default fixed:G)" : " (default fixed:G of the file)"));
  cmd.add_option("--burstiness", f.burstiness,
                 when + "K: the Gamma shape of gamma's gaps (vLLM's --burstiness: 1 = Poisson, < 1 burstier, > 1 more "
                        "regular)")
      ->capture_default_str();
  cmd.add_option("--max-concurrency", f.max_concurrency,
                 when + "N: the client's limit on requests in flight (vLLM's --max-concurrency: a request is sent "
                        "when it has arrived and fewer than N are in flight; TTFT counts from the send); 0: none")
      ->capture_default_str();
  if (run) {
    cmd.add_option("--ramp-up-strategy", f.ramp_up_strategy,
                   "linear | exponential: poisson/gamma's rate rises over the requests from --ramp-up-start-rps to "
                   "--ramp-up-end-rps (vLLM's ramp-up: request i's gap drawn at its rate; replaces --request-rate)");
    cmd.add_option("--ramp-up-start-rps", f.ramp_up_start_rps, "the ramp's first request's rate, requests/s");
    cmd.add_option("--ramp-up-end-rps", f.ramp_up_end_rps, "the ramp's last request's rate, requests/s");
  }
  cmd.add_option("--max-batched-tokens", f.max_batched_tokens,
                 when + "T: with --step-policy vllm-v1, the tokens a step runs at most (vLLM's "
                        "--max-num-batched-tokens): decodes and prompt chunks")
      ->capture_default_str();
  cmd.add_option("--kv-blocks", f.kv_blocks,
                 when + "N: blocks in each group's KV pool (vLLM's paged KV cache): a step takes the blocks its rows' "
                        "positions cover, a request is admitted when its prefill's blocks are free, and when a "
                        "running request's next token finds none the request admitted last is preempted and "
                        "recomputed later (vLLM V1's policy); 0: every slot at the longest request (nothing binds)" +
                        std::string(run ? "; auto: as many as each split's stages' free memory holds after weights "
                                          "and scratch (vLLM's rule; on CPU ranks a pool smaller than every slot at the "
                                          "longest request makes the KV store demand-paged, resident only where the "
                                          "pool's blocks are; CUDA's store is allocated whole)"
                                        : ""))
      ->capture_default_str();
  cmd.add_option("--kv-block-size", f.kv_block_size, when + "TOKENS per KV block (vLLM's --block-size)")
      ->capture_default_str();
  cmd.add_option("--pp-schedule", f.pp_schedule,
                 when + "how the M steps in flight share the requests: groups (M pinned batches of B slots, each its own "
                        "KV pool: vLLM V0's virtual engines) or batch-queue (one scheduler and KV pool over M x B slots, "
                        "up to M batches in flight: vLLM V1 under pipeline parallelism)" +
                        (run ? "; a list (groups,batch-queue) measures every split under each in the same rounds" : ""))
      ->capture_default_str();
  cmd.add_option("--step-policy", f.step_policy,
                 when + "what a step runs: " + serving::step_policy_choices() +
                     (run ? "; a list (mixed,vllm-v1) measures every split under each in the same rounds, paired with "
                            "the first" : ""))
      ->capture_default_str();
  cmd.add_option("--goodput", f.goodput,
                 when + "each request's limits, vLLM's: ttft:MS tpot:MS e2e:MS (any of them): goodput = requests "
                        "meeting every limit per second, attainment = their share")
      ->expected(1, 3);
  const std::string slo = c == Command::plan ? " (without --scenario: the TTFT p50 target of the closed batch)" : "";
  cmd.add_option("--slo-ttft", f.slo_ttft_ms, "MS: the TTFT limit, as --goodput ttft:MS" + slo);
  cmd.add_option("--slo-tpot", f.slo_tpot_ms,
                 "MS: the TPOT limit, as --goodput tpot:MS" +
                     (c == Command::plan ? std::string(" (without --scenario: the TPOT p50 target)") : ""));
  cmd.add_option("--attainment", f.attainment,
                 std::string(run ? "with --request-rate search: " : "") +
                     "the share of requests that must meet the TTFT and TPOT limits, in (0, 1] (0.9: DistServe's "
                     "goodput target; 0.99)")
      ->capture_default_str();
  if (!run)
    cmd.add_option("--seed", f.seed, when + "arrivals and lengths (the default is `ppbench run`'s: the same requests a run draws)")
        ->capture_default_str();
}

}  // namespace ppb
