// The data kit: shuffling and the global row cursor (ciuic/kit/sampler.h).
#include <ciuic/kit/sampler.h>

#include <utility>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/json.h>

namespace ciuic::kit {

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

std::vector<uint32_t> permutation(uint32_t n, uint64_t seed, uint64_t stream) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = i;
  uint64_t state = mix64(seed ^ mix64(stream + 0x5851F42D4C957F2DULL));
  auto next = [&] {
    state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  // Lemire's nearly-divisionless unbiased draw in [0, bound).
  auto below = [&](uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  };
  for (uint32_t i = n; i > 1; --i) std::swap(p[i - 1], p[below(i)]);
  return p;
}

std::string RowCursor::to_json() const {
  return nlohmann::json{{"epoch", epoch}, {"row", row}}.dump();
}

RowCursor RowCursor::parse(const std::string& text, const std::string& who) {
  const bool shallow = json_depth_problem(text).empty();  // a cursor is one flat object
  const nlohmann::json j = shallow
                               ? nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false)
                               : nlohmann::json(nlohmann::json::value_t::discarded);
  auto ok = [&](const char* k) {
    return j.contains(k) && j[k].is_number_integer() && j[k].get<int64_t>() >= 0;
  };
  if (j.is_discarded() || !j.is_object() || !ok("epoch") || !ok("row")) {
    const std::string shown = text.size() > 80 ? text.substr(0, 80) + "..." : text;
    throw Error(who + ": bad cursor '" + shown +
                "': expected {\"epoch\": <int >= 0>, \"row\": <int >= 0>}");
  }
  return RowCursor{j["epoch"].get<int64_t>(), j["row"].get<int64_t>()};
}

int64_t eval_batches_per_rank(int64_t rows, int64_t world_size, int64_t micro_batch_size) {
  const int64_t per_rank = (rows + world_size - 1) / world_size;
  return (per_rank + micro_batch_size - 1) / micro_batch_size;
}

}  // namespace ciuic::kit
