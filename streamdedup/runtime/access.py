"""Can the worker reach the broker and log in as configured? Checked once per session, before the Kafka clients start.

kafka-python takes a refused TLS certificate, a plaintext client on a TLS
port (or the reverse) and a refused SASL login for a broker that does not
answer yet: it retries until its bootstrap times out (30 s) and then raises a
retriable ``KafkaTimeoutError``, and the worker would wait forever for a
broker that will never accept it. This check talks to the first bootstrap
server that accepts a TCP connection the way the client would (the same TLS
settings, the same SASL mechanism, kafka-python's own SASL mechanism code),
each step bounded by ``timeout_s``, and sorts what it meets:

- nothing accepts a connection, or a connection breaks without a definite
  answer: ``BrokerUnavailableError`` (retriable; the worker waits and retries);
- the broker's certificate is not trusted, the broker refuses the client's
  certificate (or its lack of one: a mutual-TLS port), the port speaks TLS to
  a plaintext client or plaintext to a TLS client, the broker does not offer
  the SASL mechanism, or it refuses the user name and password:
  ``BrokerError``, with what to check. The password never appears in a message.
"""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Optional

from ..errors import BrokerError, BrokerUnavailableError, ConfigError

__all__ = ["check_access"]

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
CLIENT_ID = b"streamdedup-access-check"
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
PASSWORD_HELP = ("check kafka.sasl_plain_username and the password (STREAMDEDUP_KAFKA_SASL_PLAIN_PASSWORD, "
                 "kafka.sasl_plain_password or kafka.sasl_plain_password_file), and that the user exists on "
                 "the broker for this mechanism (SCRAM users: kafka-configs.sh --alter --add-config "
                 "'SCRAM-SHA-512=[password=...]' --entity-type users --entity-name USER)")


class _Closed(Exception):
    """The broker closed the connection (or said nothing) before a whole reply came."""


def check_access(settings: dict, timeout_s: float = 10.0) -> None:
    """Return if the first bootstrap server that answers accepts these client settings; raise what is wrong if not."""
    protocol = str(settings.get("security_protocol") or "PLAINTEXT").upper()
    last: Optional[BaseException] = None
    for host, port in _servers(settings.get("bootstrap_servers") or []):
        try:
            conn = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            last = exc
            continue
        try:
            _check_server(conn, host, port, protocol, settings, timeout_s)
            return
        finally:
            conn.close()
    raise BrokerUnavailableError(f"no bootstrap server accepts a connection ({last}); check that the broker runs "
                                 "and kafka.bootstrap_servers points at it")


def _servers(bootstrap) -> list[tuple[str, int]]:
    """(host, port) of each bootstrap server (``host:port``; ``[v6]:port``; a bare host means port 9092)."""
    if isinstance(bootstrap, str):
        bootstrap = bootstrap.split(",")
    found = []
    for entry in (e.strip() for e in bootstrap):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if not sep or not port.isdigit():
            host, port = entry, "9092"
        found.append((host.strip("[]"), int(port)))
    return found


def _check_server(conn: socket.socket, host: str, port: int, protocol: str, settings: dict,
                  timeout_s: float) -> None:
    where = f"{host}:{port}"
    if protocol in TLS_PROTOCOLS:
        conn = _tls(conn, host, port, settings, timeout_s)
    else:
        answer = _plaintext_answer(socket.create_connection((host, port), timeout=timeout_s))
        if answer == "silent":
            raise BrokerUnavailableError(f"{where} accepts connections but does not answer (within {timeout_s:g} s)")
        if answer == "closed" and _speaks_tls(host, port, timeout_s):
            raise BrokerError(f"the broker at {where} speaks TLS on this port, but kafka.security_protocol is "
                              f"{protocol}: set it to SASL_SSL (or SSL if the broker asks for no login) and "
                              "kafka.ssl_cafile to the CA that signed the broker's certificate, or point "
                              "kafka.bootstrap_servers at the broker's plaintext port")
        if answer == "closed":
            raise BrokerUnavailableError(f"{where} closed the connection without answering as a Kafka broker")
    with conn:
        if protocol == "SSL":
            _certificate_accepted(conn, where, settings)
        if protocol in SASL_PROTOCOLS:
            _log_in(conn, where, settings)
        else:
            _refuse_if_login_wanted(conn, where, protocol)


def _certificate_accepted(conn: ssl.SSLSocket, where: str, settings: dict) -> None:
    """Stop if the broker refused this client's certificate, or its lack of one.

    With TLS 1.3 the client's side of the handshake ends before the broker
    has checked the client's certificate: a refusal comes as an alert at the
    first read, which this request makes (kafka-python would take it for a
    broker that does not answer yet, and retry for good).
    """
    try:
        _request(conn, API_VERSIONS, 0, b"")
    except ssl.SSLError as exc:
        _refuse_if_certificate_refused(exc, where, settings)
        raise BrokerUnavailableError(f"the TLS connection to {where} failed ({exc.reason or exc})") from None
    except (_Closed, OSError, struct.error):
        return  # nothing definite: the clients will tell


def _refuse_if_certificate_refused(exc: ssl.SSLError, where: str, settings: dict) -> None:
    """Raise what to do if ``exc`` is the broker's alert refusing the client's certificate."""
    reason = str(exc.reason or "")
    if "ALERT" in reason and ("CERTIFICATE" in reason or "UNKNOWN_CA" in reason):
        given = settings.get("ssl_certfile") or "none, kafka.ssl_certfile is empty"
        raise BrokerError(f"the broker at {where} refused this client's certificate ({reason}): the port asks "
                          "for a client certificate signed by a CA the broker trusts; set kafka.ssl_certfile and "
                          f"kafka.ssl_keyfile to yours (now: {given}), or point kafka.bootstrap_servers at a port "
                          "that takes a SASL login") from None


def _refuse_if_login_wanted(conn: socket.socket, where: str, protocol: str) -> None:
    """Stop if the listener asks for a SASL login the settings do not give.

    A SASL listener answers a SaslHandshake with the mechanisms it offers;
    any other listener answers it with an error and none.
    """
    try:
        offered = _strings(_request(conn, SASL_HANDSHAKE, 1, _string("PLAIN")), 2)
    except (_Closed, OSError, struct.error):
        return
    if offered:
        wanted = "SASL_SSL" if protocol == "SSL" else "SASL_PLAINTEXT"
        raise BrokerError(f"the broker at {where} asks for a SASL login ({', '.join(offered)}), but "
                          f"kafka.security_protocol is {protocol}: set it to {wanted}, and set kafka.sasl_mechanism, "
                          "kafka.sasl_plain_username and the password")


def _tls(conn: socket.socket, host: str, port: int, settings: dict, timeout_s: float) -> ssl.SSLSocket:
    """The connection after a TLS handshake made as kafka-python makes it; what is wrong if it fails."""
    where = f"{host}:{port}"
    context = _ssl_context(settings)
    trusted = settings.get("ssl_cafile") or "the system's trusted CAs (kafka.ssl_cafile is empty)"
    secured = context.wrap_socket(conn, server_hostname=host.rstrip("."), do_handshake_on_connect=False)
    try:
        secured.settimeout(timeout_s)
        secured.do_handshake()
        return secured
    except ssl.SSLCertVerificationError as exc:
        secured.close()
        raise BrokerError(f"the broker at {where} presented a certificate that is not trusted "
                          f"({exc.verify_message}); kafka.ssl_cafile must be the CA that signed the broker's "
                          f"certificate (now: {trusted}), and the address in kafka.bootstrap_servers must be "
                          "one the certificate names (or set ssl_check_hostname = false in [kafka])") from None
    except ssl.SSLError as exc:
        secured.close()
        _refuse_if_certificate_refused(exc, where, settings)
        if _plaintext_answer(socket.create_connection((host, port), timeout=timeout_s)) == "answers":
            raise BrokerError(f"the broker at {where} does not speak TLS on this port (it answered in plaintext) "
                              f"but kafka.security_protocol is {settings.get('security_protocol')}: point "
                              "kafka.bootstrap_servers at the broker's TLS port, or set kafka.security_protocol "
                              "to PLAINTEXT or SASL_PLAINTEXT") from None
        raise BrokerUnavailableError(f"the TLS handshake with {where} failed ({exc.reason or exc})") from None
    except OSError as exc:
        secured.close()
        raise BrokerUnavailableError(f"the TLS handshake with {where} failed ({exc})") from None


def _ssl_context(settings: dict) -> ssl.SSLContext:
    """The client's TLS context: kafka-python's own ``ssl_context`` if given, else built from the ssl_* settings."""
    if settings.get("ssl_context") is not None:
        return settings["ssl_context"]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = bool(settings.get("ssl_check_hostname", True))
    try:
        if settings.get("ssl_cafile"):
            context.load_verify_locations(settings["ssl_cafile"])
        else:
            context.load_default_certs()
        if settings.get("ssl_certfile"):
            context.load_cert_chain(settings["ssl_certfile"], settings.get("ssl_keyfile") or None,
                                    settings.get("ssl_password"))
        if settings.get("ssl_crlfile"):
            context.load_verify_locations(crl=settings["ssl_crlfile"])
            context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"kafka.ssl_cafile, ssl_certfile or ssl_keyfile cannot be loaded ({exc}); "
                          "they must be readable PEM files") from None
    return context


def _speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    """Whether the port completes a TLS handshake (any certificate accepted: this only asks what it speaks)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return False
    with context.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False) as secured:
        try:
            secured.do_handshake()
            return True
        except (OSError, ssl.SSLError):
            return False


def _plaintext_answer(conn: socket.socket) -> str:
    """How the other end takes a plaintext ApiVersions request: "answers", "closed" (a TLS port does) or "silent".

    The connection is closed after. "silent": nothing came back within the
    socket's timeout (a broker that hangs), which says nothing of TLS.
    """
    with conn:
        try:
            _request(conn, API_VERSIONS, 0, b"")
            return "answers"
        except socket.timeout:
            return "silent"
        except (_Closed, OSError):
            return "closed"


def _log_in(conn: socket.socket, where: str, settings: dict) -> None:
    """A SASL handshake and login with the configured mechanism, user and password."""
    from kafka.net.sasl import get_sasl_mechanism

    mechanism_name = str(settings.get("sasl_mechanism") or "PLAIN")
    user = settings.get("sasl_plain_username") or ""
    try:
        reply = _request(conn, SASL_HANDSHAKE, 1, _string(mechanism_name))
        error, offered = struct.unpack_from(">h", reply)[0], _strings(reply, 2)
        if not offered:
            raise BrokerError(f"the broker's listener at {where} takes no SASL login (kafka.security_protocol is "
                              f"{settings.get('security_protocol')}): set kafka.security_protocol to SSL or "
                              "PLAINTEXT, as the listener is, or point kafka.bootstrap_servers at its SASL port")
        if error or mechanism_name not in offered:
            raise BrokerError(f"the broker at {where} does not offer SASL mechanism {mechanism_name!r} (it offers "
                              f"{', '.join(offered) or 'none'}); fix kafka.sasl_mechanism")
        try:
            mechanism = get_sasl_mechanism(mechanism_name)(host=where.rpartition(":")[0], **settings)
        except KeyError:
            raise ConfigError(f"kafka.sasl_mechanism {mechanism_name!r} is not one kafka-python knows") from None
        while not mechanism.is_done():
            reply = _request(conn, SASL_AUTHENTICATE, 1, _bytes(mechanism.auth_bytes()))
            error = struct.unpack_from(">h", reply)[0]
            message, at = _nullable_string(reply, 2)
            if error:
                raise BrokerError(f"the broker at {where} refused the SASL login of user {user!r} "
                                  f"({mechanism_name}): {message or f'error {error}'}; {PASSWORD_HELP}")
            (size,) = struct.unpack_from(">i", reply, at)
            mechanism.receive(reply[at + 4: at + 4 + max(size, 0)])
        if not mechanism.is_authenticated():
            raise BrokerError(f"the broker at {where} did not prove it knows the password of user {user!r} "
                              f"({mechanism_name}); {PASSWORD_HELP}")
    except _Closed:
        raise BrokerError(f"the broker at {where} closed the connection at the SASL handshake: its listener does not "
                          "take SASL logins; set kafka.security_protocol to SSL or PLAINTEXT, as the listener is, "
                          "or point kafka.bootstrap_servers at the broker's SASL port") from None
    except OSError as exc:
        raise BrokerUnavailableError(f"the SASL login at {where} broke off ({exc})") from None


def _request(conn: socket.socket, api_key: int, version: int, body: bytes) -> bytes:
    """Send one request (header v1) and return its reply after the correlation id (the API key: one at a time)."""
    message = struct.pack(">hhi", api_key, version, api_key) + _string(CLIENT_ID.decode()) + body
    conn.sendall(struct.pack(">i", len(message)) + message)
    (size,) = struct.unpack(">i", _read(conn, 4))
    reply = _read(conn, size)
    if size < 4 or struct.unpack_from(">i", reply)[0] != api_key:
        raise _Closed()
    return reply[4:]


def _read(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise _Closed()
        data += chunk
    return bytes(data)


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _bytes(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _strings(reply: bytes, at: int) -> list[str]:
    """An array of strings at ``at`` (int32 count, then int16-sized strings)."""
    (count,) = struct.unpack_from(">i", reply, at)
    at += 4
    found = []
    for _ in range(max(count, 0)):
        text, at = _nullable_string(reply, at)
        found.append(text or "")
    return found


def _nullable_string(reply: bytes, at: int) -> tuple[Optional[str], int]:
    (size,) = struct.unpack_from(">h", reply, at)
    if size < 0:
        return None, at + 2
    return reply[at + 2: at + 2 + size].decode("utf-8", "replace"), at + 2 + size
