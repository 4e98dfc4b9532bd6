/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The XDP hook's test wrapper: an XDP program like the real wrapper (wrapper.bpf.h),
 * but the L4 header is at SYR_TEST_L4_OFF instead of where the root program parsed it,
 * and the hash and protocol come from the batch's record. As at the hook, the policy gets no
 * packet pointer (in->data is NULL) and reads through the helper; the decision goes
 * back raw.
 */
#ifndef SYRUP_HOOK_XDP_TEST_H
#define SYRUP_HOOK_XDP_TEST_H

#define SYR_XDP_TEST_INPUT(in, data, end) ((in).l4_off = SYR_TEST_L4_OFF)

SYR_TEST_PACKET_PROGRAM(syr_test_xdp, SYR_XDP_TEST_INPUT);

#endif
