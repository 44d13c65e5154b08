// The names and value domains of each stack's flags and config fields as recorded from its own
// source (stacks/flags/*.json: repository, commit, file and line of each), and the check of an
// exported plan against them: every name written exists there and every value is in its domain.
#pragma once

#include <string>
#include <vector>

#include "sextant/interop/export.hpp"

namespace sextant::interop {

// The facts file of `target` (stacks/flags/<target_facts>.json, compiled in).
const spec::Json& flag_facts(Target target);

// What of `exported` the recorded facts do not allow, one line per setting ("--x: not a flag of
// NVIDIA/Megatron-LM at 23e00ed"); empty when every setting is a recorded name with a value in
// its domain.
std::vector<std::string> facts_problems(const Exported& exported);

}  // namespace sextant::interop
