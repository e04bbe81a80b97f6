"""Channels to the coordinator that carry the caller's credentials: TLS (a CA, optionally a client
certificate for mTLS) and a bearer token, for zeroshard.Client, zeroshard.torch and zeroshard.launch.
"""

import ipaddress
import os

import grpc

# The environment the CLI and the daemons read too (ZEROSHARD_TOKEN); the others let
# zeroshard.launch hand its TLS files to the trainers it starts.
TOKEN_ENV = "ZEROSHARD_TOKEN"
CA_ENV = "ZEROSHARD_CA"
CERT_ENV = "ZEROSHARD_CERT"
KEY_ENV = "ZEROSHARD_KEY"
# "1": send the token in plaintext to a non-loopback address too (the CLI's --insecure).
INSECURE_ENV = "ZEROSHARD_INSECURE"

_AUTHORIZATION_KEY = "authorization"
_MIN_TOKEN_CHARS = 16
_MAX_TOKEN_CHARS = 256


def check_token(token, source):
    """Raises ValueError unless `token` is 16 to 256 printable characters without spaces (the
    coordinator's rule), naming `source`."""
    if not _MIN_TOKEN_CHARS <= len(token) <= _MAX_TOKEN_CHARS:
        raise ValueError(f"{source}: the token is {len(token)} characters; tokens are "
                         f"{_MIN_TOKEN_CHARS} to {_MAX_TOKEN_CHARS}")
    if any(not "!" <= c <= "~" for c in token):
        raise ValueError(f"{source}: the token holds a space or a non-printable character")
    return token


def read_token_file(path):
    """The first line of `path`, stripped (as the CLI's --token_file)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline().strip()
    except OSError as e:
        raise ValueError(f"token_file: cannot read {path}: {e.strerror}") from None
    return check_token(first, f"token_file {path}")


def _read_pem(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what}: cannot read {path}: {e.strerror}") from None


# The rule of is_loopback_target in one phrase, for the error that refuses a target (the C++
# clients' kLoopbackRule, security/loopback.h).
LOOPBACK_RULE = ("loopback means 127.0.0.0/8 or ::1 written as an IP literal, `localhost` without "
                 "a trailing dot or a dns://SERVER/ authority, or a unix: socket")


def _is_loopback_literal(host):
    """`host` (no port, no brackets) is an IPv4 or IPv6 literal in a loopback range. Only the
    forms gRPC parses as literals: "127.1", a trailing dot or a zone id go to the resolver."""
    if "%" in host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _host_of(address):
    """The host of "host:port", "[v6]:port", "[v6]", "host" or a bare IPv6 address; None when the
    form is broken (an unclosed bracket, a port that is not decimal digits)."""
    port = None
    if address.startswith("["):
        close = address.find("]")
        if close < 0:
            return None
        host, rest = address[1:close], address[close + 1:]
        if rest:
            if not rest.startswith(":"):
                return None
            port = rest[1:]
    elif address.count(":") == 1:
        host, port = address.split(":", 1)
    else:
        host = address  # no port, or a bare IPv6 address
    if port is not None and not (port.isascii() and port.isdigit()):
        return None
    return host or None


def _is_loopback_dns_address(address, server_named):
    """One address of a dns: target (or a plain one, which gRPC resolves as dns:///address).
    `server_named`: the target's authority names the DNS server to ask, which then answers even
    localhost."""
    host = _host_of(address)
    if host is None:
        return False
    if _is_loopback_literal(host):
        return True  # a literal is never looked up
    # Exactly "localhost": the system resolver answers it from /etc/hosts. "localhost." is fully
    # qualified, which /etc/hosts does not list, so a DNS server answers it.
    return not server_named and host.lower() == "localhost"


def is_loopback_target(target):
    """True when every address of gRPC target `target` is on this machine without asking a DNS
    server: unix sockets; IP literals in 127.0.0.0/8 or ::1 (as "host:port", "[v6]:port",
    "dns:[//authority/]host:port" or an "ipv4:"/"ipv6:" list); and "localhost" (any case, no
    trailing dot) unless a "dns://SERVER/" authority names the DNS server to ask. Everything else
    is False, even names that resolve to loopback, "localhost." included. The C++ clients' rule
    too (security/loopback.h)."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("ipv4:", "ipv6:"):
        if target.startswith(scheme):
            hosts = [_host_of(a) for a in target[len(scheme):].split(",")]
            return all(h is not None and _is_loopback_literal(h) for h in hosts)
    server_named = False
    if target.startswith("dns:"):
        target = target[len("dns:"):]
        if target.startswith("//"):
            slash = target.find("/", 2)
            if slash < 0:
                return False
            server_named = slash > 2
            target = target[slash + 1:]
        elif target.startswith("/"):
            target = target[1:]
    return _is_loopback_dns_address(target, server_named)


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds "authorization: Bearer <token>" to every call. An interceptor rather than
    grpc.access_token_call_credentials, which gRPC refuses on plaintext channels: the loopback
    ones need it. coordinator_channel checks, before using it on a plaintext channel, that the
    address is loopback or the caller said insecure."""

    def __init__(self, token):
        self._metadata = (_AUTHORIZATION_KEY, f"Bearer {token}")

    def _with_token(self, details):
        metadata = list(details.metadata or []) + [self._metadata]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_token(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._with_token(client_call_details), request_iterator)


def resolve(token=None, ca=None, cert=None, key=None):
    """(token, ca, cert, key) with the environment's values where an argument is None. An empty
    string turns a value off."""
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if ca is None:
        ca = os.environ.get(CA_ENV) or None
    if cert is None:
        cert = os.environ.get(CERT_ENV) or None
    if key is None:
        key = os.environ.get(KEY_ENV) or None
    return token or None, ca or None, cert or None, key or None


def coordinator_channel(address, token=None, ca=None, cert=None, key=None, credentials=None,
                        insecure=None):
    """A grpc.Channel to `address`. TLS when `ca` (a PEM file of the CA that signed the
    coordinator's certificate) or `credentials` (grpc.ChannelCredentials) is given, with the
    client certificate `cert`/`key` (PEM files) for mTLS; plaintext otherwise. `token` is sent as
    a bearer token on every call. Each of token, ca, cert and key defaults to its environment
    variable ($ZEROSHARD_TOKEN, $ZEROSHARD_CA, $ZEROSHARD_CERT, $ZEROSHARD_KEY).

    Without TLS a token is sent only to a loopback address (is_loopback_target), unless
    `insecure` is true (default: $ZEROSHARD_INSECURE is "1").

    Raises ValueError naming the option for an unreadable file, a malformed token, or a token
    that would cross the network in plaintext.
    """
    token, ca, cert, key = resolve(token, ca, cert, key)
    if (cert is None) != (key is None):
        raise ValueError("cert and key: give both (mTLS) or neither")
    if cert is not None and ca is None and credentials is None:
        raise ValueError("cert: a client certificate needs ca (TLS)")
    if token is not None:
        check_token(token, "token")
    if insecure is None:
        insecure = os.environ.get(INSECURE_ENV) == "1"
    if (token is not None and credentials is None and ca is None and not insecure
            and not is_loopback_target(address)):
        raise ValueError(
            f"token: refusing to send a token in plaintext to {address}, which is not a loopback "
            f"address ({LOOPBACK_RULE}): connect with TLS (ca), or pass insecure=True (or set {INSECURE_ENV}=1) "
            "to send it unencrypted as before (trusted networks only)")
    if credentials is None and ca is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read_pem(ca, "ca"),
            private_key=_read_pem(key, "key") if key else None,
            certificate_chain=_read_pem(cert, "cert") if cert else None)
    if credentials is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, credentials)
    if token is not None:
        channel = grpc.intercept_channel(channel, _BearerToken(token))
    return channel
