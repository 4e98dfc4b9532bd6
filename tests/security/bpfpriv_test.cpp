// Security suite, classes 2 and 3 of docs/security.md (docs/security/bpfpriv.md): what a
// tenant's policy may call, declare and get verified as. Mallory, an unprivileged user,
// deploys policies that reach for kernel memory (a tracing helper, a kernel function, a
// kernel variable, a raw map reference, a program array) or leak a kernel pointer into
// a map she can read back; each must be refused before it runs, naming what is not
// allowed and the hook, and nothing she sees may carry a kernel address.
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <regex>
#include <string>

#include "security.h"

namespace syrup::test::security {
namespace {

using nlohmann::json;

// A kernel address as the kernel prints one (x86-64: 16 hex digits from ffff).
bool has_kernel_address(const std::string& s) {
  static const std::regex re("(^|[^0-9a-fA-F])(0x)?ffff[0-9a-fA-F]{12}([^0-9a-fA-F]|$)", std::regex::icase);
  return std::regex_search(s, re);
}

// Policies. Each is complete C for <syrup/policy.h>.
const char* kPacketProbeRead = R"(#include <syrup/policy.h>
SYR_ARRAY(loot, __u64, 1);
SYR_POLICY(struct syr_input *in)
{
	__u32 k = 0;
	__u64 *v = syr_map_lookup(&loot, &k);
	if (v)
		bpf_probe_read_kernel(v, 8, in->ctx);
	return SYR_PASS;
}
)";

const char* kThreadProbeRead = R"(#include <syrup/policy.h>
SYR_ARRAY(loot, __u64, 1);
SYR_POLICY(struct syr_thread *t)
{
	__u32 k = 0;
	__u64 *v = syr_map_lookup(&loot, &k);
	if (v)
		bpf_probe_read_kernel(v, 8, (void *)v);
	return SYR_PASS;
}
)";

// Stores the address of a map value into that value.
const char* kPacketLeakValue = R"(#include <syrup/policy.h>
SYR_ARRAY(loot, __u64, 1);
SYR_POLICY(struct syr_input *in)
{
	__u32 k = 0;
	__u64 *v = syr_map_lookup(&loot, &k);
	if (v)
		*v = (__u64)v;
	return SYR_PASS;
}
)";

const char* kThreadLeakValue = R"(#include <syrup/policy.h>
SYR_ARRAY(loot, __u64, 1);
SYR_POLICY(struct syr_thread *t)
{
	__u32 k = 0;
	__u64 *v = syr_map_lookup(&loot, &k);
	if (v)
		*v = (__u64)v;
	return SYR_PASS;
}
)";

// Stores its context pointer (a kernel object's address).
const char* kPacketLeakCtx = R"(#include <syrup/policy.h>
SYR_ARRAY(loot, __u64, 1);
SYR_POLICY(struct syr_input *in)
{
	__u32 k = 0;
	__u64 *v = syr_map_lookup(&loot, &k);
	if (v)
		*v = (__u64)in->ctx;
	return SYR_PASS;
}
)";

// Dereferences a hash lookup without the NULL check: rejected by any verifier, after a
// map reference that a privileged verifier prints as the map's kernel address.
const char* kPacketNoNullCheck = R"(#include <syrup/policy.h>
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} loot SEC(".maps");
SYR_POLICY(struct syr_input *in)
{
	__u32 k = in->hash;
	__u64 *v = syr_map_lookup(&loot, &k);
	*v = 1;
	return SYR_PASS;
}
)";

const char* kPacketProgArray = R"(#include <syrup/policy.h>
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u32);
} jumps SEC(".maps");
SYR_POLICY(struct syr_input *in)
{
	bpf_tail_call(in->ctx, &jumps, 0);
	return SYR_PASS;
}
)";

const char* kThreadProgArray = R"(#include <syrup/policy.h>
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u32);
} jumps SEC(".maps");
SYR_POLICY(struct syr_thread *t)
{
	__u32 k = 0;
	return bpf_map_lookup_elem(&jumps, &k) ? SYR_PASS : 0;
}
)";

const char* kPacketKfunc = R"(#include <syrup/policy.h>
extern void bpf_rcu_read_lock(void) __ksym;
extern void bpf_rcu_read_unlock(void) __ksym;
SYR_POLICY(struct syr_input *in)
{
	bpf_rcu_read_lock();
	bpf_rcu_read_unlock();
	return SYR_PASS;
}
)";

const char* kThreadKfunc = R"(#include <syrup/policy.h>
extern void bpf_rcu_read_lock(void) __ksym;
extern void bpf_rcu_read_unlock(void) __ksym;
SYR_POLICY(struct syr_thread *t)
{
	bpf_rcu_read_lock();
	bpf_rcu_read_unlock();
	return SYR_PASS;
}
)";

// A kernel variable's address, stored where the tenant reads it.
const char* kThreadKsymVar = R"(#include <syrup/policy.h>
extern const int bpf_prog_active __ksym;
SYR_ARRAY(loot, __u64, 1);
SYR_POLICY(struct syr_thread *t)
{
	__u32 k = 0;
	__u64 *v = syr_map_lookup(&loot, &k);
	if (v)
		*v = (__u64)&bpf_prog_active;
	return SYR_PASS;
}
)";

// A 64-bit load already marked as a map reference (src_reg 1) with a descriptor number
// of its own: passed through, the kernel would resolve fd 3 in syrupd.
const char* kPacketRawMapFd = R"(#include <syrup/policy.h>
SYR_POLICY(struct syr_input *in)
{
	asm volatile(".quad 0x0000000300001118\n.quad 0" ::: "r1");
	return SYR_PASS;
}
)";

json result(int r) { return {{"r", r}, {"err", syr_last_error()}}; }

// Mallory deploys `src` at the socket-select hook on a group of her own.
json mallory_socket_select(const char* src, const char* app) {
  return as_user(kMallory, [&] {
    UdpGroup g(2);
    int id = deploy_socket_select_source(src, "mallory.c", g.fds(), app);
    json out = result(id);
    if (id > 0) syr_remove_policy(id);
    return out;
  });
}

// Mallory deploys `src` at the thread hook for her own process.
json mallory_thread(const char* src, const char* app) {
  return as_user(kMallory, [&] {
    syr_deploy_opts o{.sz = sizeof o, .app = app};
    int id = syr_deploy_policy_source(src, std::strlen(src), "mallory.c", SYR_HOOK_THREAD, &o);
    json out = result(id);
    if (id > 0) syr_remove_policy(id);
    return out;
  });
}

class BpfPriv : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { daemon_ = start_suite_daemon(); }
  static void TearDownTestSuite() { stop_suite_daemon(daemon_); }
  void SetUp() override { SYRUP_REQUIRE_ROOT(); }
  static Daemon* daemon_;
};
Daemon* BpfPriv::daemon_ = nullptr;

// Expects a refusal (-EPERM unless said) whose text holds each of `needles` and no
// kernel address.
void expect_refused(const json& j, std::initializer_list<std::string> needles, int err = -EPERM) {
  ASSERT_TRUE(j.contains("r")) << j.dump();
  EXPECT_EQ(j["r"].get<int>(), err) << j.dump();
  std::string e = j["err"].get<std::string>();
  for (auto& n : needles) EXPECT_NE(e.find(n), std::string::npos) << "no '" << n << "' in: " << e;
  EXPECT_FALSE(has_kernel_address(e)) << e;
}

// The audit's finding: at the thread hook (agent backend on this kernel) the helper list
// was not checked at all, and bpf_probe_read_kernel deployed.
TEST_F(BpfPriv, ThreadPolicyCallingProbeReadKernelIsRefusedNamingHelperAndHook) {
  expect_refused(mallory_thread(kThreadProbeRead, "bp-thr-probe"), {"bpf_probe_read_kernel", "thread hook"});
}

TEST_F(BpfPriv, SocketSelectPolicyCallingProbeReadKernelIsRefused) {
  expect_refused(mallory_socket_select(kPacketProbeRead, "bp-ss-probe"),
                 {"bpf_probe_read_kernel", "socket-select hook"});
}

// A map value's address, or the context pointer, stored into a map Mallory can dump:
// loaded without CAP_PERFMON the verifier refuses it ("leaks addr").
TEST_F(BpfPriv, SocketSelectPolicyStoringAMapValuePointerIsRefusedByTheVerifier) {
  expect_refused(mallory_socket_select(kPacketLeakValue, "bp-ss-leakv"), {"verifier rejected", "leaks addr"}, -EACCES);
}

TEST_F(BpfPriv, SocketSelectPolicyStoringItsContextPointerIsRefusedByTheVerifier) {
  expect_refused(mallory_socket_select(kPacketLeakCtx, "bp-ss-leakc"), {"verifier rejected", "leaks addr"}, -EACCES);
}

// The same at the thread hook's agent backend (a BPF_PROG_TYPE_SYSCALL program loaded
// with CAP_BPF alone).
TEST_F(BpfPriv, ThreadPolicyStoringAMapValuePointerIsRefusedByTheVerifier) {
  expect_refused(mallory_thread(kThreadLeakValue, "bp-thr-leakv"), {"verifier rejected", "leaks addr"}, -EACCES);
}

// The verifier log a tenant gets back: full (the whole tail syrupd returns), and no map
// address in it (a privileged verifier prints `r1 = 0xffff...` for a map reference).
TEST_F(BpfPriv, VerifierLogOfARejectedPolicyHasNoKernelAddress) {
  json j = mallory_socket_select(kPacketNoNullCheck, "bp-ss-log");
  ASSERT_LT(j["r"].get<int>(), 0) << j.dump();
  std::string e = j["err"].get<std::string>();
  EXPECT_NE(e.find("verifier rejected"), std::string::npos) << e;
  EXPECT_NE(e.find("map_value_or_null"), std::string::npos) << "the log's reason is missing: " << e;
  EXPECT_FALSE(has_kernel_address(e)) << e;
}

TEST_F(BpfPriv, ProgramArrayMapIsRefusedNamingTheTypeAndHook) {
  expect_refused(mallory_socket_select(kPacketProgArray, "bp-ss-jmp"), {"'jumps'", "prog_array", "socket-select hook"});
  expect_refused(mallory_thread(kThreadProgArray, "bp-thr-jmp"), {"'jumps'", "prog_array", "thread hook"});
}

TEST_F(BpfPriv, KernelFunctionCallIsRefusedNamingItOnHooksThatAllowNone) {
  expect_refused(mallory_socket_select(kPacketKfunc, "bp-ss-kf"), {"bpf_rcu_read_lock", "socket-select hook"});
  expect_refused(mallory_thread(kThreadKfunc, "bp-thr-kf"), {"bpf_rcu_read_lock", "thread hook"});
}

TEST_F(BpfPriv, KernelVariableIsRefused) {
  expect_refused(mallory_thread(kThreadKsymVar, "bp-thr-ksym"), {"bpf_prog_active"});
}

TEST_F(BpfPriv, RawMapReferenceIsRefused) {
  expect_refused(mallory_socket_select(kPacketRawMapFd, "bp-ss-raw"), {"64-bit load of kind 1"});
}

// XDP: the same calls, on an interface of a test network, for a port a socket
// of Mallory's holds.
class BpfPrivXdp : public BpfPriv {
 protected:
  void SetUp() override {
    BpfPriv::SetUp();
    if (IsSkipped()) return;
    net_ = std::make_unique<TestNet>(71);
    if (!net_->ok()) GTEST_SKIP() << "cannot make a veth pair and namespace";
  }
  void TearDown() override { net_.reset(); }

  json mallory_xdp(const char* src, const char* app) {
    const std::string ifname = net_->host_if;
    return as_user(kMallory, [&] {
      // A claim needs a socket receiving all of the port's frames: [::], dual-stack.
      UniqueFd fd;
      uint16_t port = bound_udp(fd, AF_INET6, "::", false);
      if (!port) return json{{"error", "no socket"}};
      syr_deploy_opts o{.sz = sizeof o, .app = app, .ifname = ifname.c_str(), .ports = &port, .n_ports = 1};
      int id = syr_deploy_policy_source(src, std::strlen(src), "mallory.c", SYR_HOOK_XDP, &o);
      json out = result(id);
      if (id > 0) syr_remove_policy(id);
      return out;
    });
  }
  std::unique_ptr<TestNet> net_;
};

TEST_F(BpfPrivXdp, ProbeReadKernelAndKernelFunctionsAreRefused) {
  expect_refused(mallory_xdp(kPacketProbeRead, "bp-xdp-probe"), {"bpf_probe_read_kernel", "xdp hook"});
  expect_refused(mallory_xdp(kPacketKfunc, "bp-xdp-kf"), {"bpf_rcu_read_lock", "xdp hook"});
}

// XDP policies are verified with CAP_BPF and CAP_NET_ADMIN only, like socket-select's:
// storing a map value's address or the context pointer is refused by the verifier.
TEST_F(BpfPrivXdp, PolicyStoringAMapValuePointerOrItsContextIsRefusedByTheVerifier) {
  expect_refused(mallory_xdp(kPacketLeakValue, "bp-xdp-leakv"), {"verifier rejected", "leaks addr"}, -EACCES);
  expect_refused(mallory_xdp(kPacketLeakCtx, "bp-xdp-leakc"), {"verifier rejected", "leaks addr"}, -EACCES);
}

// What the verifier says of a rejected XDP policy reaches the tenant without kernel
// addresses.
TEST_F(BpfPrivXdp, VerifierLogOfARejectedPolicyHasNoKernelAddress) {
  json j = mallory_xdp(kPacketNoNullCheck, "bp-xdp-log");
  ASSERT_LT(j["r"].get<int>(), 0) << j.dump();
  std::string e = j["err"].get<std::string>();
  EXPECT_NE(e.find("map_value_or_null"), std::string::npos) << "the log's reason is missing: " << e;
  EXPECT_FALSE(has_kernel_address(e)) << e;
}


}  // namespace
}  // namespace syrup::test::security
