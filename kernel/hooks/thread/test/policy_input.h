/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* The thread hook's part of <syrup/policy.h> in a test build: the hook's own part and
 * the test build's common part (kernel/hooks/test_run.bpf.h). */
#include "../policy_input.h"
#include "test_run.bpf.h"
