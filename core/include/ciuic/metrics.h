// ciuic/metrics.h — named numbers a plugin contributes to each metrics record.
//
// Every slot object may override PluginObject-derived interfaces' append_metrics(); the trainer
// calls it on the main thread at each logged step and merges the values into metrics.jsonl
// (keys are prefixed by nothing: choose names like "comm_bytes", "offload_host_gib").
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ciuic {

struct Metrics {
  std::vector<std::pair<std::string, double>> values;
  void set(std::string key, double value) {
    for (auto& kv : values)
      if (kv.first == key) {
        kv.second = value;
        return;
      }
    values.emplace_back(std::move(key), value);
  }
};

}  // namespace ciuic
