// What epcomm-check-env concludes from an EnvironmentReport: fatal problems (the configuration
// cannot work), warnings (it works badly or risks trouble) and information.
#pragma once

#include <string>
#include <vector>

#include "check_env/environment_report.hpp"

namespace epcomm::tools {

enum class Severity { kFatal, kWarning, kInfo };

struct Advice {
  Severity severity = Severity::kInfo;
  std::string text;
  std::string command;  // a shell command that fixes it, if there is one; kept whole for copy and paste
};

// "fatal", "warning" or "info".
const char* severity_name(Severity severity);

// The advice for running `intended_ranks` ranks on this node (at least 1), placed as epcomm's
// tools place them: rank r on GPU r % (number of GPUs). Fatal entries come first.
std::vector<Advice> advise(const EnvironmentReport& report, int intended_ranks);

bool has_fatal(const std::vector<Advice>& advice);

}  // namespace epcomm::tools
