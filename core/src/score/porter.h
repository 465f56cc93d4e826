// score/porter.h — the Porter stemmer as NLTK's PorterStemmer() (its default mode,
// NLTK_EXTENSIONS) stems, which rouge-score's use_stemmer=True applies to tokens longer than
// three characters.
//
// Input: a lowercase ASCII token (rouge-score's tokens are [a-z0-9]+); other bytes are treated
// as consonants, as NLTK treats any character other than a, e, i, o, u and a vowel-like 'y'.
// Checked against NLTK 3.10 word by word (tests/score/score_test.cpp, tests/fixtures/gen_score.py).
// Threading: pure, reentrant. Failure: none.
#pragma once

#include <ciuic/export.h>

#include <string>

namespace ciuic::score {

CIUIC_API std::string porter_stem(std::string word);

}  // namespace ciuic::score
