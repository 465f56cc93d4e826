// score/stats.h — percentiles of per-answer figures (response time: median and p90).
//
// percentile(values, q) is numpy.percentile(values, q)'s default ("linear": the sorted values
// interpolated at index q/100 * (n - 1), with numpy's lerp), so the median is percentile 50.
// Threading: pure, reentrant. Failure: NaN for no values; q outside 0..100 is clamped.
#pragma once

#include <ciuic/export.h>

#include <vector>

namespace ciuic::score {

CIUIC_API double percentile(std::vector<double> values, double q);

}  // namespace ciuic::score
