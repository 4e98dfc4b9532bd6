/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The socket-select hook's test wrapper: the policy as an XDP program over a frame whose
 * L4 header starts at SYR_TEST_L4_OFF (kernel/hooks/test_run.bpf.h). Like the real
 * wrapper (wrapper.bpf.h) it hands the policy direct pointers to the linear bytes
 * (data, data_end) and the whole length; the decision goes back raw in the batch.
 */
#ifndef SYRUP_HOOK_SOCKET_SELECT_TEST_H
#define SYRUP_HOOK_SOCKET_SELECT_TEST_H

#define SYR_SOCKET_SELECT_TEST_INPUT(in, data, end)                                  \
	do {                                                                           \
		(in).data = (data) + SYR_TEST_L4_OFF;                                  \
		(in).data_end = (end);                                                 \
	} while (0)

SYR_TEST_PACKET_PROGRAM(syr_test_socket_select, SYR_SOCKET_SELECT_TEST_INPUT);

#endif
