/*
 * kv_proto.h: the wire format of the RocksDB UDP key-value server (kv_server) and its
 * load generator (kv_loadgen), and the deterministic contents of its database.
 *
 * Design: one request per datagram, one response per request, fixed little-endian
 * layouts. The request type is the FIRST payload word, so a socket-select policy finds
 * it at input offset 8 (right after the 8-byte UDP header): that is where `sita` reads
 * it by default, and KV_SCAN == 2 is its default long_type. `id` and `stamp` are opaque
 * to the server and echoed back, so the load generator needs no table of requests in
 * flight to compute latencies. The database holds keys "k%015u" (16 bytes, so
 * lexicographic order is numeric order) with values derived from the key by a fixed
 * function, so anyone (tests, the load generator) can check an answer without the DB.
 *
 * Plain C, usable from C and C++.
 */
#ifndef KV_PROTO_H
#define KV_PROTO_H

#include <endian.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Request types. Room for more: the server answers unknown types with KV_BAD_REQUEST. */
enum kv_type {
	KV_GET = 1,   /* point lookup of `key` */
	KV_SCAN = 2,  /* iterate `scan_len` keys from `key` (0: the server's default) */
	KV_STATS = 3, /* the server's counters, as JSON text after the header */
};

enum kv_status {
	KV_OK = 0,
	KV_NOT_FOUND = 1,   /* GET of a key that is not in the DB */
	KV_BAD_REQUEST = 2, /* truncated, oversized or unknown type: counted by the server */
	KV_ERROR = 3,       /* RocksDB returned an error */
};

/* A request: 32 bytes, every field little-endian. */
struct kv_request {
	uint32_t type;     /* enum kv_type; input offset 8 for a socket-select policy */
	uint32_t scan_len; /* SCAN: keys to visit, 0 = the server's calibrated default */
	uint64_t key;      /* key index */
	uint64_t id;       /* echoed */
	uint64_t stamp;    /* echoed (the load generator puts its scheduled send time here) */
};

/* A response: this header, then `len` bytes (GET: the value; STATS: JSON text). */
struct kv_response {
	uint32_t status;  /* enum kv_status */
	uint32_t type;    /* the request's type (0 if the request was too short to carry one) */
	uint64_t id;      /* echoed (0 if the request was too short to carry one) */
	uint64_t stamp;   /* echoed (0 if the request was too short to carry one) */
	uint32_t worker;  /* index of the worker (socket) that served the request */
	uint32_t count;   /* SCAN: keys visited */
	uint64_t digest;  /* GET: kv_digest of the value; SCAN: of every key and value visited */
	uint32_t len;     /* bytes that follow */
	uint32_t pad;
};

#define KV_KEY_LEN 16      /* "k" + 15 digits */
#define KV_VALUE_LEN 100   /* bytes per value */
#define KV_MAX_DATAGRAM 2048

/* The key string of index i (KV_KEY_LEN bytes, no terminator needed by users). */
static inline void kv_key(uint64_t i, char out[KV_KEY_LEN + 1])
{
	snprintf(out, KV_KEY_LEN + 1, "k%015llu", (unsigned long long)(i % 1000000000000000ULL));
}

/* splitmix64: a tiny, well-mixed generator, used for the values and by the load generator. */
static inline uint64_t kv_mix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* The value stored under key index i: KV_VALUE_LEN bytes that depend only on i. */
static inline void kv_value(uint64_t i, char out[KV_VALUE_LEN])
{
	uint64_t s = i * 0x2545f4914f6cdd1dULL + 1;
	for (int off = 0; off < KV_VALUE_LEN; off += 8) {
		uint64_t r = kv_mix64(&s);
		memcpy(out + off, &r, KV_VALUE_LEN - off < 8 ? (size_t)(KV_VALUE_LEN - off) : 8);
	}
}

/* FNV-1a 64, chained: kv_digest(kv_digest(FNV_BASIS, a), b) digests a then b. */
#define KV_FNV_BASIS 0xcbf29ce484222325ULL
static inline uint64_t kv_digest(uint64_t h, const void *data, size_t len)
{
	const unsigned char *p = (const unsigned char *)data;
	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

#ifdef __cplusplus
}
#endif

#endif /* KV_PROTO_H */
