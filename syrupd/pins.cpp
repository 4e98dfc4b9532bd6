#include "pins.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

namespace syrup::pins {
namespace {
std::string g_root = "/sys/fs/bpf/syrup";
}

void set_root(std::string root) { g_root = std::move(root); }
const std::string& root() { return g_root; }

std::string app_dir(std::string_view app) { return g_root + "/apps/" + std::string(app); }
std::string app_maps_dir(std::string_view app) { return app_dir(app) + "/maps"; }
std::string app_map(std::string_view app, std::string_view map) {
  return app_maps_dir(app) + "/" + std::string(map);
}
std::vector<std::string> app_map_names(std::string_view app) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(app_maps_dir(app), ec))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}
std::string policy_dir(std::string_view app, int id) {
  return app_dir(app) + "/policies/" + std::to_string(id);
}
std::string policy_prog(std::string_view app, int id) { return policy_dir(app, id) + "/prog"; }
std::string policy_map(std::string_view app, int id, std::string_view map) {
  return policy_dir(app, id) + "/" + std::string(map);
}

std::string xdp_dir() { return g_root + "/xdp"; }
std::string xdp_pin_name(std::string_view ifname) {
  std::string n(ifname);
  std::replace(n.begin(), n.end(), '.', ':');
  return n;
}
std::string xdp_ifname(std::string_view pin_name) {
  std::string n(pin_name);
  std::replace(n.begin(), n.end(), ':', '.');
  return n;
}
std::string xdp_root_dir(std::string_view ifname) { return xdp_dir() + "/" + xdp_pin_name(ifname); }
std::string xdp_root_obj(std::string_view ifname, std::string_view obj) {
  return xdp_root_dir(ifname) + "/" + std::string(obj);
}

std::string thread_scx_dir() { return g_root + "/thread_scx"; }
std::string thread_scx_obj(std::string_view obj) { return thread_scx_dir() + "/" + std::string(obj); }

int make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  return ec ? -ec.value() : 0;
}

int remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  return ec ? -ec.value() : 0;
}

}  // namespace syrup::pins
