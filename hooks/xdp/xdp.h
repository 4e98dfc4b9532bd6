// The XDP hook backend (user side): one root program per interface, owned by syrupd and
// attached through libxdp, dispatching to each application's policy through a
// BPF_MAP_TYPE_PROG_ARRAY slot keyed by the (protocol, port)s the application claimed.
//
// Design: libxdp's own multi-program dispatcher needs BPF trampolines (freplace), which
// kernels without CONFIG_FUNCTION_TRACER lack; Syrup's dispatch is its own root program
// and tail calls, so it works everywhere XDP does. Where libxdp's dispatcher can run the
// root it does, beside other libxdp programs (docs/xdp.md). Invariants:
//  - a root program is attached to an interface exactly while some application's policy
//    is installed on it; removing the last one detaches it and leaves the interface as
//    it was;
//  - a (protocol, port) belongs to at most one application per interface;
//  - replacing an application's policy is one prog-array slot update: every frame sees
//    the old or the new program, and other applications' slots are not touched;
//  - a root program this syrupd did not attach (another daemon's, or any other XDP
//    program) is never replaced silently: the deploy fails and says whose it is; a libxdp
//    dispatcher is joined (libxdp replaces it by one running its programs and the root);
//  - the attach mode suits the device: generic on veth and tun (partial checksums);
//  - a root the kernel no longer runs (its interface deleted or moved to another network
//    namespace, or the program detached or replaced by another tool) is lost: it is
//    never used again, its policies are removed saying why, and the next deploy to the
//    interface attaches a new root. syrupd learns of it from rtnetlink's link news and
//    checks again before every XDP deploy;
//  - an interface renamed keeps its root and policies (the kernel attaches by index): they
//    follow the new name in roots_, the pins, the policies' keys and the state file.
#pragma once

#include <memory>
#include <map>
#include <string>

#include "compiler.h"
#include "hook.h"
#include "recorder.h"
#include "unique_fd.h"
#include "syrup/xdp_abi.h"

namespace syrup::xdp {

class Root;

class XdpHook : public Hook {
 public:
  explicit XdpHook(Compiler& compiler) : compiler_(compiler) {}
  const char* name() const override { return "xdp"; }
  const char* compile_define() const override { return "SYR_HOOK_XDP"; }
  const char* wrapper() const override { return "xdp/wrapper.bpf.h"; }
  std::vector<std::string> system_maps() const override {
    return {SYR_XDP_META_MAP, SYR_XDP_CPUS_MAP, SYR_XDP_XSKS_MAP, SYR_XDP_EXEC_CPU_MAP, SYR_STATS_MAP,
            "syr_xdp_scratch", kRecCtlMap, kRecRingMap};
  }
  // The common helpers, the packet read and length and the wrapper's redirect; no kernel
  // functions.
  Allowlist allowlist() const override {
    Allowlist a{policy_helpers(), {}, policy_map_types()};
    a.helpers.insert({BPF_FUNC_xdp_load_bytes, BPF_FUNC_xdp_get_buff_len, BPF_FUNC_redirect_map});
    return a;
  }
  int make_target(const Caller& caller, proto::Message& req, std::unique_ptr<Target>& out,
                  pid_t& owner, std::string& err) override;
  void recover() override;
  int event_fd() const override { return events_.get(); }
  bool refresh() override;
  int adopt(const nlohmann::json& saved, LoadedPolicy& p, std::unique_ptr<Target>& out,
            std::string& err) override;

  // Detaches and forgets `root` when no application uses it any more.
  void release_if_unused(std::shared_ptr<Root> root);

 private:
  int get_root(const std::string& ifname, std::shared_ptr<Root>& out, std::string& err);
  // Re-keys the roots (and moves their pins) whose interface the kernel now names otherwise;
  // whether any was.
  bool follow_renames();

  Compiler& compiler_;
  std::map<std::string, std::shared_ptr<Root>> roots_;  // by current interface name; none lost
  UniqueFd events_;  // rtnetlink, RTMGRP_LINK: news of the interfaces (-1: none)
};

}  // namespace syrup::xdp
