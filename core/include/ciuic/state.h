// ciuic/state.h — how plugins hand state to checkpoints and take it back.
//
// A StateDict is an ordered list of named tensors (scalars are 0-d tensors). The checkpoint code
// writes it to safetensors and reads it back exactly (dtype and shape preserved). Tensors handed
// out are CPU tensors the checkpoint may keep; tensors handed in are CPU tensors the plugin copies
// from (it must not keep references).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ciuic {

using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

// Looks up `key`; returns an undefined tensor when absent.
inline at::Tensor state_get(const StateDict& sd, const std::string& key) {
  for (const auto& kv : sd)
    if (kv.first == key) return kv.second;
  return {};
}

}  // namespace ciuic
