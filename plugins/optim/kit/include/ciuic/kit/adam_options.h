// The recipe options every Adam-family optimizer plugin shares (adamw, cpu_adam, and any
// out-of-tree one that wants the same keys, ranges and error messages): betas and eps.
//
// Header-only, part of the optim kit (not of the plugin ABI). Usage:
//   const ciuic::OptionSpec kOptions[] = {..., ciuic::kit::kAdamBetas, ciuic::kit::kAdamEps};
//   const ciuic::kit::AdamHyper h = ciuic::kit::adam_hyper(cfg);   // validated
// Failure: adam_hyper throws through Config::fail (a recipe error naming the key and its
// file:line) when betas is not two numbers, each in [0, 1). Threading: none; call it from the
// plugin's factory.
#pragma once

#include <cmath>
#include <vector>

#include <ciuic/config.h>
#include <ciuic/plugin.h>

namespace ciuic::kit {

inline constexpr Option<std::vector<double>> kAdamBetas{
    "betas", "[0.9, 0.999]", "Adam beta1, beta2 (each in [0, 1))", 0.0, 1.0};
inline constexpr Option<double> kAdamEps{"eps", "1e-8", "Adam epsilon (added to sqrt(v))", 0.0,
                                         NAN};

struct AdamHyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

inline AdamHyper adam_hyper(const Config& cfg) {
  const std::vector<double> betas = cfg.get(kAdamBetas);
  if (betas.size() != 2 || betas[0] >= 1.0 || betas[1] >= 1.0)
    cfg.fail(kAdamBetas.key(), "expected two numbers [beta1, beta2], each in [0, 1)");
  return {betas[0], betas[1], cfg.get(kAdamEps)};
}

}  // namespace ciuic::kit
