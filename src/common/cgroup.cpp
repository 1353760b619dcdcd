#include "common/cgroup.h"

#include <fstream>
#include <sstream>

namespace ppb {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::vector<std::string_view> split_fields(std::string_view text, char sep) {
  std::vector<std::string_view> fields;
  size_t pos = 0;
  for (size_t end; (end = text.find(sep, pos)) != std::string_view::npos; pos = end + 1)
    fields.push_back(text.substr(pos, end - pos));
  fields.push_back(text.substr(pos));
  return fields;
}

bool CgroupMembership::has(std::string_view controller) const {
  for (std::string_view c : split_fields(controllers, ','))
    if (c == controller) return true;
  return false;
}

std::vector<CgroupMembership> cgroup_memberships(std::string_view self_cgroup) {
  std::vector<CgroupMembership> out;
  for (std::string_view line : split_fields(self_cgroup, '\n')) {
    const size_t c1 = line.find(':');
    if (c1 == std::string_view::npos) continue;
    const size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, c1);
    const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    out.push_back({id == "0" && controllers.empty(), controllers, line.substr(c2 + 1)});
  }
  return out;
}

std::vector<std::filesystem::path> cgroup_dirs_up(const std::filesystem::path& root, std::string_view path) {
  std::vector<std::string_view> parts;
  for (std::string_view part : split_fields(path, '/')) {
    if (part == "..") return {};
    if (!part.empty() && part != ".") parts.push_back(part);
  }
  std::vector<std::filesystem::path> dirs;
  for (size_t depth = parts.size() + 1; depth-- > 0;) {
    std::filesystem::path dir = root;
    for (size_t i = 0; i < depth; ++i) dir /= std::string(parts[i]);
    dirs.push_back(dir);
  }
  return dirs;
}

}  // namespace ppb
