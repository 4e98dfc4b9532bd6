/* A packet policy that calls a thread helper by mistake: refused with an error that says
 * the helper is for thread policies (SocketSelectBadInput.ThreadPolicyIsRefused...). */
SYR_ARRAY(long_scan, __u64, 4);

SYR_POLICY(struct syr_input *in)
{
	/* line 8: */
	return syr_thread_hint(long_scan, in);
}
