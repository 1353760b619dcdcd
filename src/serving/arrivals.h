// The requests of a serving scenario (issue 37): when each arrives and how long its prompt and
// its output are. Pure: no MPI, no device; every split and layout of a run draws the same list
// from the same seed.
//
// Arrivals follow vLLM's `vllm bench serve` (vllm/benchmarks/serve.py, `get_request`): the gap
// before each request is Gamma(shape = burstiness, scale = theta = 1 / (request_rate *
// burstiness)), so its mean is 1/request_rate and its squared coefficient of variation
// 1/burstiness; burstiness 1 is a Poisson process (exponential gaps), < 1 burstier, > 1 more
// regular; request_rate = inf sends every request at t = 0 and burstiness = inf every
// 1/request_rate s. As there, one gap is drawn per request, the first one included (the first
// request arrives after its gap, not at 0), and the arrival times are their running sums.
// Current vLLM then rescales those sums so that the last arrival is exactly N / request_rate
// ("to stabilize the throughput data from different random seeds"); `rescale_to_rate` does the
// same (default on), off gives the raw sums (vLLM before that change).
//
// Comparable, not identical: vLLM draws with numpy's global generator, ppbench with
// std::mt19937_64 and std::gamma_distribution (libstdc++'s Marsaglia-Tsang), so the same seed
// gives the same distribution, not the same numbers.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ppb::serving {

/// One request of a scenario. Times on the scenario's clock: seconds from its start.
struct Request {
  double arrival_s = 0.0;  ///< when it arrives (s, >= 0; non-decreasing over a scenario)
  int prompt_len = 1;      ///< prompt tokens (>= 1)
  int gen_len = 1;         ///< output tokens to generate, the first (from prefill) included (>= 1)
};

/// A distribution of token counts, from a spec string (see parse_length_spec).
struct LengthSpec {
  enum class Kind { fixed, uniform, lognormal };
  Kind kind = Kind::fixed;
  int n = 1;             ///< fixed:n
  int lo = 1, hi = 1;    ///< uniform:lo,hi (inclusive)
  double median = 1.0;   ///< lognormal:median,sigma: median = exp(mu) tokens
  double sigma = 0.0;    ///< lognormal: sigma of the log
  std::string text;      ///< the spec as given (for the results file)
};

/// Parses a length spec: `fixed:n` (n >= 1), `uniform:a,b` (integers 1 <= a <= b, both
/// inclusive), `lognormal:median,sigma` (median > 0 tokens, sigma >= 0; mu = ln(median)).
/// `flag` names the option in errors (e.g. "--prompt-lens").
/// Throws ppb::UserError naming the flag, the text and the valid forms.
LengthSpec parse_length_spec(const std::string& text, const std::string& flag);

/// One draw of `spec` from `rng`, clamped to [1, max_len] (max_len >= 1: the context limit).
/// fixed: n; uniform: std::uniform_int_distribution(lo, hi); lognormal:
/// std::lognormal_distribution(ln(median), sigma) rounded to the nearest integer.
int draw_length(const LengthSpec& spec, int max_len, std::mt19937_64& rng);

/// Seconds between arrivals, vLLM's definition (file comment).
/// `vllm bench serve --ramp-up-strategy`: the rate of request i of N is
/// start + (end - start) p (linear) or start (end / start)^p (exponential), p = i / max(N - 1, 1),
/// its gap drawn at that rate, and the arrivals not rescaled (vLLM's _get_current_request_rate
/// and get_request).
enum class RampUp { none, linear, exponential };

struct ArrivalSpec {
  double request_rate = 1.0;    ///< R: requests/s, > 0; +inf: all at t = 0 (unused with a ramp)
  double burstiness = 1.0;      ///< K: Gamma shape, > 0; 1 = Poisson; +inf: constant gaps 1/R
  bool rescale_to_rate = true;  ///< current vLLM: last arrival rescaled to exactly N / R (never with a ramp)
  RampUp ramp = RampUp::none;
  double ramp_start_rps = 0.0, ramp_end_rps = 0.0;  ///< the ramp's first and last request's rate, > 0
};

/// "none", "linear", "exponential"; and the ramp `text` names (@throws ppb::UserError naming
/// --ramp-up-strategy and the valid names).
const char* ramp_up_name(RampUp r);
RampUp parse_ramp_up(const std::string& text);

/// Checks R > 0 and K > 0 (either may be +inf; NaN is invalid).
/// Throws ppb::UserError naming --request-rate or --burstiness and what would be valid.
void validate(const ArrivalSpec& spec);

/// The n raw gaps (s), before the running sum and the rescale: gap i ~ Gamma(K, 1/(R*K)) drawn
/// with std::gamma_distribution<double>(K, 1/(R*K)) from `rng`, in order; 0 each when R = inf,
/// 1/R each when K = inf. Throws ppb::UserError on an invalid spec (validate()).
std::vector<double> draw_gaps(const ArrivalSpec& spec, int n, std::mt19937_64& rng);

/// Arrival times (s) from gaps: running sums, then (spec.rescale_to_rate, R finite, last sum >
/// 0) every time multiplied by (n / R) / last sum, as vLLM's get_request does. Shape [n].
std::vector<double> arrival_times(const ArrivalSpec& spec, const std::vector<double>& gaps);

// generate_requests (a whole synthetic scenario from one seed) is in scenario.h.

}  // namespace ppb::serving
