// Identity of a model directory and of an input file, recorded in outputs so `--resume` refuses
// to mix results from a different model or input.
#pragma once
#include <cstdint>
#include <string>

#include "core/hash.hpp"  // fnv1a64, used by callers of this header

namespace dz {

class InputFile;

// Hash of config.json and of every safetensors header (names, dtypes, shapes, offsets) + sizes.
// dummy_weights: the config alone (the weights follow from it and the fixed seed).
std::string model_fingerprint(const std::string& dir, bool dummy_weights = false);
// Hash of the document offsets and the token count.
std::string input_fingerprint(const InputFile& in);

}  // namespace dz
