/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TLS interception for the egress proxy (OpenSSL 3): the deployment CA that
 * every sandbox trusts, the leaf certificates minted from it for the hosts
 * the proxy intercepts (those with credential-injection rules), and the
 * client side that verifies the real upstream.
 *
 *   tlsmint_new(data_dir, operator_ca_file, &m, why, sizeof why)
 *   tlsmint_ca_pem(m)                     -> into each sandbox's trust store
 *   per intercepted connection to host (egress_host.text):
 *           tlsmint_server_ctx(m, host, &sctx)  -> SSL_new(sctx): server to the sandbox
 *           tlsmint_client_ssl(m, host, &cssl)  -> client to the upstream
 *
 * The CA files, in the directory given to tlsmint_new():
 *   egress-ca.key  the CA's private key, PEM (PKCS#8), mode 0600
 *   egress-ca.pem  the CA certificate, PEM, mode 0644
 * Both are created when neither exists: an EC P-256 key and a self-signed
 * X.509 v3 certificate (CA:TRUE pathlen:0 critical, keyUsage keyCertSign
 * cRLSign critical, subjectKeyIdentifier, subject "O=hutch, CN=hutch egress
 * CA <8 random hex>", a random 127-bit serial, valid from an hour ago for
 * ten years, SHA-256). Each is written to a temporary file in the same
 * directory, fsynced and then hard-linked into place, which never replaces
 * an existing file: two daemons racing on one directory cannot end up
 * trusting different CAs (the loser fails with -EEXIST).
 *
 * An existing CA is loaded, never repaired. The key must be a regular file
 * (opened O_NOFOLLOW: a symlink is refused), owned by the effective user and
 * with no group or other permission bits (0600 or 0400), as ssh requires of
 * its keys: a key that others could read may have leaked, and since every
 * sandbox trusts this CA, only the operator can decide to keep it. The
 * certificate must be a regular file too (not a symlink), must be a CA
 * (X509_check_ca()), must match the key and must not have expired. An
 * encrypted key is refused (nothing here ever prompts for a passphrase).
 *
 * Conventions as elsewhere in lib/: >= 0 on success, -errno on failure;
 * ret_* are written only on success; destructors accept NULL. A tlsmint is
 * not locked: use it from one thread (the proxy's loop). The SSL_CTX and
 * SSL objects it hands out are ordinary OpenSSL objects, usable as such.
 * Every failing call leaves OpenSSL's per-thread error queue empty, so a
 * stale error cannot confuse a later SSL_get_error() in the proxy.
 */
#pragma once

#include <openssl/ssl.h>
#include <stddef.h>

#define TLSMINT_CA_KEY_FILE "egress-ca.key"
#define TLSMINT_CA_CERT_FILE "egress-ca.pem"

/* Intercepted hosts whose server SSL_CTX is kept; past it the least recently
 * used is dropped (a held reference stays valid). */
#define TLSMINT_CACHE_MAX 512
/* A minted leaf is valid from an hour ago (clock skew in the sandbox) for
 * this long, never past the CA's own notAfter... */
#define TLSMINT_LEAF_DAYS 7
/* ...and is minted again once it is this close to its notAfter. */
#define TLSMINT_LEAF_RENEW_S (24 * 3600)

typedef struct tlsmint tlsmint;

/* Load the CA from dir (see above), or create it when neither file exists;
 * make the leaf key (EC P-256, one for every leaf of this tlsmint) and the
 * shared upstream client context. upstream_ca_file: a PEM file of extra CAs
 * trusted for upstream servers, besides the system store
 * (SSL_CTX_set_default_verify_paths()); NULL for the system store only.
 * Errors, each with a one-line English reason in why when why is not NULL:
 *   -EINVAL  one of the two CA files exists without the other; a file that
 *            is not a regular file, does not parse, is encrypted, is not a
 *            CA, does not match the key, or has expired; an upstream CA
 *            file with no certificate in it
 *   -ELOOP   a CA file is a symlink
 *   -EPERM   the key is not owned by the effective user or is accessible
 *            to group or others
 *   -EEXIST  another process created a CA file while this one did
 *   -ENOENT, -EACCES, ... from open(), write(), link() (dir, upstream file)
 *   -ENOMEM, -EIO (an OpenSSL failure) */
int tlsmint_new(const char *dir, const char *upstream_ca_file, tlsmint **ret, char *why,
                size_t whylen);
tlsmint *tlsmint_free(tlsmint *m); /* returns NULL */
void tlsmint_freep(tlsmint **m);

/* The CA certificate as PEM text, NUL-terminated, owned by m: what goes into
 * sandboxes' trust stores. */
const char *tlsmint_ca_pem(const tlsmint *m);

/* A server SSL_CTX for terminating the sandbox's TLS to host: canonical host
 * text (egress_host.text: a lowercase DNS name without trailing dot, a
 * dotted quad, or an RFC 5952 IPv6 address without brackets); anything
 * else, including text that egress_host_parse() would canonicalize to
 * something different, is -EINVAL, so one host has one cache entry.
 *
 * The context holds a leaf certificate for exactly that name (subjectAltName
 * DNS:host or IP:addr; never a wildcard), EC P-256, basicConstraints CA:FALSE,
 * keyUsage digitalSignature, extendedKeyUsage serverAuth, authorityKeyId,
 * signed by the CA, which is sent in the chain. TLS 1.2 and up; client
 * renegotiation refused; no server-side session cache (tickets resume).
 * ALPN: "http/1.1" is selected when the client offers it; a client that
 * offers only other protocols (h2) gets no ALPN answer and the handshake
 * goes on: the proxy speaks HTTP/1.1 on both sides.
 *
 * Contexts are cached per host (TLSMINT_CACHE_MAX, least recently used
 * dropped first) and minted again when the leaf nears its end. *ret is a new
 * reference: the caller releases it with SSL_CTX_free(), and it stays valid
 * after the cache drops it. -EINVAL (host), -EKEYEXPIRED (the CA has
 * expired since tlsmint_new()), -ENOMEM, -EIO (OpenSSL). */
int tlsmint_server_ctx(tlsmint *m, const char *host, SSL_CTX **ret);

/* The shared client context for upstream connections, owned by m (valid
 * until tlsmint_free()): TLS 1.2 and up, SSL_VERIFY_PEER against the system
 * store plus upstream_ca_file (never the egress CA), ALPN "http/1.1". An SSL
 * made from it directly checks the chain but not the name: use
 * tlsmint_client_ssl(). */
SSL_CTX *tlsmint_client_ctx(tlsmint *m);

/* A new client SSL for connecting to host (canonical text as for
 * tlsmint_server_ctx()): SNI set for names (never for addresses, RFC 6066
 * §3), and the peer's certificate checked for exactly that name (no partial
 * wildcards) or that IP address. A mismatch fails the handshake with
 * X509_V_ERR_HOSTNAME_MISMATCH / X509_V_ERR_IP_ADDRESS_MISMATCH in
 * SSL_get_verify_result(). The caller attaches the fd and frees the SSL.
 * -EINVAL (host), -ENOMEM. */
int tlsmint_client_ssl(tlsmint *m, const char *host, SSL **ret);
