// epcomm-check-env's output: a readable report with one section per subject, or one JSON object.
#pragma once

#include <string>
#include <vector>

#include "check_env/advice.hpp"
#include "check_env/environment_report.hpp"

namespace epcomm::tools {

// Sections "CUDA", "GPUs", "Peer access", "MPS", "NVSHMEM", "InfiniBand", "Environment",
// "Advice", then a one-line verdict.
std::string format_report(const EnvironmentReport& report, const std::vector<Advice>& advice, int intended_ranks);

// The same facts as one JSON object (keys: cuda, gpus, peers, mps, nvshmem, infiniband,
// environment, advice, ok).
std::string format_report_json(const EnvironmentReport& report, const std::vector<Advice>& advice, int intended_ranks);

}  // namespace epcomm::tools
