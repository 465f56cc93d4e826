// numpy.percentile's "linear" method (score/stats.h).
#include "score/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ciuic::score {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  q = std::clamp(q, 0.0, 100.0) / 100.0;
  const double index = q * static_cast<double>(v.size() - 1);
  const double lo_f = std::floor(index);
  const size_t lo = static_cast<size_t>(lo_f);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double t = index - lo_f, a = v[lo], b = v[hi];
  // numpy's _lerp: from below for t < 0.5, from above otherwise.
  const double d = b - a;
  return t >= 0.5 ? b - d * (1 - t) : a + d * t;
}

}  // namespace ciuic::score
