// Arrivals and lengths of a serving scenario (see arrivals.h for the definitions' sources).
#include "serving/arrivals.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/error.h"

namespace ppb::serving {
namespace {

const char* kLengthForms =
    "fixed:n (n >= 1), uniform:a,b (integers 1 <= a <= b) or lognormal:median,sigma "
    "(median > 0 tokens, sigma >= 0), e.g. lognormal:256,0.8";

[[noreturn]] void bad_length_spec(const std::string& flag, const std::string& text,
                                  const std::string& why) {
  throw UserError(flag + " '" + text + "': " + why + "; valid: " + kLengthForms);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string::size_type start = 0;
  while (true) {
    const auto end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

bool parse_int(const std::string& s, int& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

bool parse_double(const std::string& s, double& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty() && std::isfinite(out);
}

}  // namespace

LengthSpec parse_length_spec(const std::string& text, const std::string& flag) {
  LengthSpec spec;
  spec.text = text;
  const auto colon = text.find(':');
  if (colon == std::string::npos) bad_length_spec(flag, text, "no ':' after the distribution");
  const std::string kind = text.substr(0, colon);
  const std::vector<std::string> args = split(text.substr(colon + 1), ',');
  if (kind == "fixed") {
    spec.kind = LengthSpec::Kind::fixed;
    if (args.size() != 1 || !parse_int(args[0], spec.n) || spec.n < 1)
      bad_length_spec(flag, text, "fixed takes one integer n >= 1");
  } else if (kind == "uniform") {
    spec.kind = LengthSpec::Kind::uniform;
    if (args.size() != 2 || !parse_int(args[0], spec.lo) || !parse_int(args[1], spec.hi))
      bad_length_spec(flag, text, "uniform takes two integers a,b");
    if (spec.lo < 1 || spec.lo > spec.hi)
      bad_length_spec(flag, text, "uniform needs 1 <= a <= b");
  } else if (kind == "lognormal") {
    spec.kind = LengthSpec::Kind::lognormal;
    if (args.size() != 2 || !parse_double(args[0], spec.median) ||
        !parse_double(args[1], spec.sigma))
      bad_length_spec(flag, text, "lognormal takes two numbers median,sigma");
    if (!(spec.median > 0.0) || !(spec.sigma >= 0.0))
      bad_length_spec(flag, text, "lognormal needs median > 0 and sigma >= 0");
  } else {
    bad_length_spec(flag, text, "unknown distribution '" + kind + "'");
  }
  return spec;
}

int draw_length(const LengthSpec& spec, int max_len, std::mt19937_64& rng) {
  if (max_len < 1) throw UserError("length limit " + std::to_string(max_len) + " must be >= 1");
  double value = 1.0;
  switch (spec.kind) {
    case LengthSpec::Kind::fixed:
      value = spec.n;
      break;
    case LengthSpec::Kind::uniform:
      value = std::uniform_int_distribution<int>(spec.lo, spec.hi)(rng);
      break;
    case LengthSpec::Kind::lognormal:
      value = std::round(std::lognormal_distribution<double>(std::log(spec.median), spec.sigma)(rng));
      break;
  }
  // Clamp as a double first: a lognormal tail can exceed INT_MAX.
  return static_cast<int>(std::clamp(value, 1.0, static_cast<double>(max_len)));
}

void validate(const ArrivalSpec& spec) {
  auto fmt = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  if (!(spec.request_rate > 0.0))
    throw UserError("--request-rate " + fmt(spec.request_rate) +
                    ": must be > 0 requests/s (inf: every request at t = 0)");
  if (!(spec.burstiness > 0.0))
    throw UserError("--burstiness " + fmt(spec.burstiness) +
                    ": must be > 0 (the Gamma shape: 1 = Poisson, < 1 burstier, > 1 more "
                    "regular, inf = constant gaps)");
  if (spec.ramp != RampUp::none &&
      (!(spec.ramp_start_rps > 0) || !(spec.ramp_end_rps > 0) || !std::isfinite(spec.ramp_start_rps) ||
       !std::isfinite(spec.ramp_end_rps)))
    throw UserError("--ramp-up-start-rps " + fmt(spec.ramp_start_rps) + ", --ramp-up-end-rps " + fmt(spec.ramp_end_rps) +
                    ": both requests/s, > 0 and finite");
}

const char* ramp_up_name(RampUp r) {
  return r == RampUp::linear ? "linear" : r == RampUp::exponential ? "exponential" : "none";
}

RampUp parse_ramp_up(const std::string& text) {
  if (text.empty() || text == "none") return RampUp::none;
  if (text == "linear") return RampUp::linear;
  if (text == "exponential") return RampUp::exponential;
  throw UserError("--ramp-up-strategy '" + text + "' is unknown; valid: linear, exponential (vLLM's)");
}

namespace {

/// Request i of n's rate (vLLM's _get_current_request_rate).
double ramp_rate(const ArrivalSpec& spec, int i, int n) {
  const double p = static_cast<double>(i) / std::max(n - 1, 1);
  if (spec.ramp == RampUp::linear) return spec.ramp_start_rps + (spec.ramp_end_rps - spec.ramp_start_rps) * p;
  return spec.ramp_start_rps * std::pow(spec.ramp_end_rps / spec.ramp_start_rps, p);
}

}  // namespace

std::vector<double> draw_gaps(const ArrivalSpec& spec, int n, std::mt19937_64& rng) {
  validate(spec);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> gaps(static_cast<std::size_t>(std::max(n, 0)), 0.0);
  if (spec.ramp != RampUp::none) {
    std::gamma_distribution<double> gamma;
    for (int i = 0; i < n; ++i) {
      const double rate = ramp_rate(spec, i, n);
      gaps[i] = spec.burstiness == inf ? 1.0 / rate
                                       : gamma(rng, std::gamma_distribution<double>::param_type(
                                                        spec.burstiness, 1.0 / (rate * spec.burstiness)));
    }
    return gaps;
  }
  if (spec.request_rate == inf) return gaps;
  if (spec.burstiness == inf) {
    std::fill(gaps.begin(), gaps.end(), 1.0 / spec.request_rate);
    return gaps;
  }
  const double theta = 1.0 / (spec.request_rate * spec.burstiness);
  std::gamma_distribution<double> gamma(spec.burstiness, theta);
  for (double& g : gaps) g = gamma(rng);
  return gaps;
}

std::vector<double> arrival_times(const ArrivalSpec& spec, const std::vector<double>& gaps) {
  std::vector<double> t(gaps.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < gaps.size(); ++i) t[i] = sum += gaps[i];
  const bool finite_rate = std::isfinite(spec.request_rate);
  if (spec.rescale_to_rate && spec.ramp == RampUp::none && finite_rate && !t.empty() && t.back() != 0.0) {
    // vLLM: target_total_delay_s = total_requests / request_rate; every delay times
    // target / delay_ts[-1] (the last one then equals the target up to rounding).
    const double factor = (static_cast<double>(t.size()) / spec.request_rate) / t.back();
    for (double& x : t) x *= factor;
  }
  return t;
}

}  // namespace ppb::serving
