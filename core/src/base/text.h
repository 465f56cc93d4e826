// Internal: small text helpers shared by the recipe, the registry and the CLI.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <ciuic/export.h>

namespace ciuic::text {

// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions): the number of
// single-character insertions, deletions, substitutions or swaps turning `a` into `b`.
CIUIC_API size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` by edit_distance, or "" when none is close enough to be a
// plausible typo (distance <= max(1, len(word) / 3), or `word` differs only in case).
// Ties go to the earlier candidate.
CIUIC_API std::string closest(std::string_view word, const std::vector<std::string>& candidates);

// Joins `items` with `sep`.
CIUIC_API std::string join(const std::vector<std::string>& items, std::string_view sep);

// Splits `s` at every `sep` (empty fields are kept).
CIUIC_API std::vector<std::string> split(std::string_view s, char sep);

}  // namespace ciuic::text
