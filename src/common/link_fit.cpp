#include "common/link_fit.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace ppb {

double link_fit_time_s(const LinkFit& fit, double bytes) {
  return fit.latency_s + (fit.bandwidth_Bps > 0 ? bytes / fit.bandwidth_Bps : 0.0);
}

LinkFit fit_link(const std::vector<LinkSample>& samples) {
  // Rows x_i = (1 / t_i, n_i / t_i), target 1: the relative residual of α + β n_i against t_i.
  double s11 = 0, s12 = 0, s22 = 0, b1 = 0, b2 = 0;
  int used = 0;
  for (const LinkSample& s : samples) {
    if (!(s.median_s > 0) || !std::isfinite(s.median_s) || !(s.bytes >= 0) || !std::isfinite(s.bytes)) continue;
    const double x1 = 1.0 / s.median_s, x2 = s.bytes / s.median_s;
    s11 += x1 * x1;
    s12 += x1 * x2;
    s22 += x2 * x2;
    b1 += x1;
    b2 += x2;
    ++used;
  }
  if (used == 0) throw InternalError("fit_link: no sample with a positive, finite time");
  double alpha = 0, beta = 0;
  const double det = s11 * s22 - s12 * s12;
  // det is 0 (to rounding) when every size is equal, or all are 0 bytes: latency alone.
  const bool solvable = s22 > 0 && det > 1e-12 * s11 * s22;
  if (solvable) {
    alpha = (b1 * s22 - b2 * s12) / det;
    beta = (s11 * b2 - s12 * b1) / det;
  }
  if (!solvable || beta < 0) {  // no size dependence: α alone
    alpha = b1 / s11;
    beta = 0;
  } else if (alpha < 0) {  // the line through the origin: β alone
    alpha = 0;
    beta = b2 / s22;
  }
  LinkFit fit;
  fit.latency_s = alpha;
  fit.bandwidth_Bps = beta > 0 ? 1.0 / beta : 0.0;
  for (const LinkSample& s : samples) {
    if (!(s.median_s > 0) || !std::isfinite(s.median_s) || !(s.bytes >= 0) || !std::isfinite(s.bytes)) continue;
    fit.max_rel_error = std::max(fit.max_rel_error, std::abs(link_fit_time_s(fit, s.bytes) - s.median_s) / s.median_s);
  }
  return fit;
}

}  // namespace ppb
