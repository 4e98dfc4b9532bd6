/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The XDP hook's part of <syrup/policy.h> in a test build: the hook's own part (reads
 * through bpf_xdp_load_bytes() at in->l4_off) and the test build's common part. */
#include "../policy_input.h"
#define SYR_TEST_PACKETS 1
#include "test_run.bpf.h"
