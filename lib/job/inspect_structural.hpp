// The structural diff of a checkpoint whose family dayzero has no parser for (inspect.cpp calls it):
// config.json keys and tensor names and shapes matched against dayzero's modules.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dz {

struct StructRow {
  std::string where, module, kind, params, status, evidence;  // status: reusable / reusable with
                                                               // different parameters / new
};

// Rows for the checkpoint in DIR with config.json CONFIG; *family gets its model_type (and wrapper).
std::vector<StructRow> structural_diff(const std::string& dir, const nlohmann::json& config, std::string* family);

}  // namespace dz
