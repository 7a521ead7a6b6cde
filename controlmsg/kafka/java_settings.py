"""The Java client's settings, translated to librdkafka's: what users of Spark's ``format("kafka")`` and of
the Java client already have in their options and properties files.

:func:`translate` maps what librdkafka has an equivalent for and refuses, in one line that says what to
write instead, what it has none for. The table is docs/SECURITY.md's "Settings in the Java client's
names". In short:

- ``sasl.jaas.config`` (:mod:`controlmsg.kafka.jaas`): ``PlainLoginModule`` and ``ScramLoginModule``
  give ``sasl.username`` and ``sasl.password`` (and PLAIN's ``sasl.mechanism`` when it is missing; SCRAM's
  must be given, as in Java); ``OAuthBearerLoginModule`` gives ``sasl.oauthbearer.client.id``,
  ``.client.secret``, ``.scope`` and ``.extensions`` with ``sasl.oauthbearer.method=oidc`` (which needs
  ``sasl.oauthbearer.token.endpoint.url``), or, without a token endpoint, librdkafka's unsecured JWT;
  ``Krb5LoginModule`` gives ``sasl.kerberos.principal``, ``.keytab`` and ``.service.name``;
- trust and key stores (:mod:`controlmsg.kafka.keystores`): a JKS or PKCS12 truststore becomes a PEM
  ``ssl.ca.location``, a JKS keystore a PKCS12 ``ssl.keystore.location``; inline PEM
  (``ssl.truststore.certificates``, ``ssl.keystore.key``, ``ssl.keystore.certificate.chain``) becomes
  ``ssl.ca.pem``, ``ssl.key.pem``, ``ssl.certificate.pem``;
- ``ssl.endpoint.identification.algorithm`` ``""`` (Java's "no host name check") becomes ``none``;
- a few renamed settings (``fetch.max.wait.ms``, ``max.request.size``, ``buffer.memory``,
  ``send.buffer.bytes``, ``receive.buffer.bytes``);
- Java classes (serializers, interceptors, JSSE tuning, callback handlers) are refused.

Translated settings replace the Java ones; a librdkafka setting given too, with another value, is an
error (give one). A config without Java settings comes back equal, so :func:`translate` may run on every
client's settings (:func:`controlmsg.kafka.settings.for_client` does). Error messages never hold a value
of ``sasl.jaas.config`` or of a password.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from controlmsg.errors import ConfigError
from controlmsg.kafka.jaas import JaasEntry, parse_jaas

__all__ = ["JAVA_SETTINGS", "REFUSED_JAVA_SETTINGS", "RENAMED_SETTINGS", "translate"]

RENAMED_SETTINGS: Final = {
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "max.request.size": "message.max.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
}
"""Java name -> librdkafka name, the value as it is (a socket buffer's ``-1``, "the system's", becomes 0)."""

_CLASS_REFUSAL: Final = "a Java class, which librdkafka cannot load"
REFUSED_JAVA_SETTINGS: Final = {
    "key.serializer": "controlmsg writes its own envelope and keys as bytes (the data source's key column, the CLI's "
                      "--key-field); remove it",
    "value.serializer": "controlmsg writes its own envelope around the payload (the data source's value column or "
                        "its JSON rows); remove it",
    "key.deserializer": "controlmsg reads keys as bytes (a string when UTF-8); remove it",
    "value.deserializer": "controlmsg decodes its own envelope; remove it",
    "interceptor.classes": f"{_CLASS_REFUSAL}; remove it",
    "partitioner.class": f"{_CLASS_REFUSAL}; remove it (librdkafka's partitioner setting takes a name such as "
                         "murmur2_random, Java's default)",
    "metric.reporters": f"{_CLASS_REFUSAL}; remove it (librdkafka's statistics: statistics.interval.ms)",
    "sasl.client.callback.handler.class": f"{_CLASS_REFUSAL}; remove it and give the credentials in sasl.jaas.config "
                                          "or sasl.username/sasl.password",
    "sasl.login.class": f"{_CLASS_REFUSAL}; remove it",
    "ssl.engine.factory.class": f"{_CLASS_REFUSAL}; remove it and give the certificates as files (ssl.ca.location, "
                                "ssl.keystore.location)",
    "ssl.keymanager.algorithm": "a JSSE setting librdkafka has no equivalent for (it uses OpenSSL); remove it",
    "ssl.trustmanager.algorithm": "a JSSE setting librdkafka has no equivalent for (it uses OpenSSL); remove it",
    "ssl.secure.random.implementation": "a JSSE setting librdkafka has no equivalent for (it uses OpenSSL); remove it",
    "ssl.provider": "a JSSE setting librdkafka has no equivalent for (it uses OpenSSL); remove it",
    "security.providers": f"{_CLASS_REFUSAL}; remove it",
    "ssl.protocol": "librdkafka negotiates the TLS version with OpenSSL's defaults; remove it",
    "ssl.enabled.protocols": "librdkafka negotiates the TLS version with OpenSSL's defaults; remove it",
    "default.api.timeout.ms": "controlmsg's waits are its own: use the command's --timeout or the data source's "
                              "option timeout; remove it",
}
"""Java name -> why it is refused and what to write instead."""

_OAUTH_HANDLERS: Final = frozenset({
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
})
_STORE_SETTINGS: Final = frozenset({
    "ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type", "ssl.truststore.certificates",
    "ssl.keystore.type", "ssl.keystore.key", "ssl.keystore.certificate.chain",
})
JAVA_SETTINGS: Final = frozenset({
    "sasl.jaas.config", "sasl.login.callback.handler.class", "buffer.memory", *RENAMED_SETTINGS,
    *REFUSED_JAVA_SETTINGS, *_STORE_SETTINGS,
})
"""Every name :func:`translate` changes or refuses, but for the ones it only adjusts (a keystore librdkafka
cannot read, ``ssl.endpoint.identification.algorithm``, an OIDC token endpoint without a method)."""

_SCRAM: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")


class _Translation:
    """One translation: the settings as they become, where each came from, and the one way to refuse."""

    def __init__(self, config: Mapping[str, Any], origin: Mapping[str, str] | None) -> None:
        self.out: dict[str, Any] = dict(config)
        self.origin: dict[str, str] = dict(origin or {})

    def named(self, key: str) -> str:
        return f"{key!r}" + (f" (from {self.origin[key]})" if key in self.origin else "")

    def refuse(self, key: str, why: str) -> ConfigError:
        return ConfigError(f"Kafka client setting {self.named(key)}: {why}")

    def put(self, key: str, value: Any, source: str) -> None:
        """Set librdkafka's ``key`` from the Java setting ``source``; one given as well must agree."""
        if key in self.out and str(self.out[key]) != str(value):
            raise self.refuse(source, f"gives {key}, which is given too, with another value: give one of them")
        self.out[key] = value
        if source in self.origin:
            self.origin[key] = self.origin[source]

    def take(self, key: str) -> str | None:
        value = self.out.pop(key, None)
        return None if value is None else str(value)

    def mechanism(self) -> str | None:
        value = self.out.get("sasl.mechanism", self.out.get("sasl.mechanisms"))
        return None if value is None else str(value).strip().upper()


def translate(config: Mapping[str, Any], origin: Mapping[str, str] | None = None) -> tuple[dict[str, Any],
                                                                                           dict[str, str]]:
    """``config`` with the Java client's settings made librdkafka's, and ``origin`` (setting -> where it
    came from, e.g. ``"client.properties:3"`` or ``"-X"``) extended to the settings made. Blocks only to
    convert a JKS store (keytool, about a second, once per store and machine). Raises
    :class:`ConfigError` that names the Java setting (and where it came from) and says what to write
    instead; never with a secret in it."""
    t = _Translation(config, origin)
    for key in sorted(REFUSED_JAVA_SETTINGS.keys() & t.out.keys()):
        raise t.refuse(key, REFUSED_JAVA_SETTINGS[key])
    for java, native in RENAMED_SETTINGS.items():
        if java in t.out:
            value = t.take(java)
            t.put(native, "0" if java.endswith("buffer.bytes") and value == "-1" else value, java)
    if "buffer.memory" in t.out:
        memory = t.take("buffer.memory") or ""
        if not memory.strip().isdigit():
            raise t.refuse("buffer.memory", f"must be a number of bytes (librdkafka's queue.buffering.max.kbytes "
                                            f"is set from it), got {memory!r}")
        t.put("queue.buffering.max.kbytes", str(max(1, -(-int(memory) // 1024))), "buffer.memory")
    algorithm = t.out.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        text = str(algorithm).strip().lower()
        t.out["ssl.endpoint.identification.algorithm"] = "none" if text == "" else text
    _callback_handler(t)
    if "sasl.jaas.config" in t.out:
        _jaas(t, _parse_jaas_named(t))
    if t.mechanism() == "OAUTHBEARER" and t.out.get("sasl.oauthbearer.token.endpoint.url"):
        t.out.setdefault("sasl.oauthbearer.method", "oidc")
    _stores(t)
    return t.out, t.origin


def _parse_jaas_named(t: _Translation) -> JaasEntry:
    """The entry of ``sasl.jaas.config`` (taken out of the settings); its syntax errors name the setting."""
    text = t.take("sasl.jaas.config") or ""
    try:
        return parse_jaas(text)
    except ConfigError as exc:
        t.out["sasl.jaas.config"] = text
        raise t.refuse("sasl.jaas.config", str(exc).removeprefix("sasl.jaas.config: ")) from None


def _callback_handler(t: _Translation) -> None:
    handler = t.out.get("sasl.login.callback.handler.class")
    if handler is None:
        return
    if str(handler).strip() not in _OAUTH_HANDLERS:
        raise t.refuse("sasl.login.callback.handler.class",
                       f"{_CLASS_REFUSAL}; remove it (librdkafka's built-in OAUTHBEARER OIDC login takes "
                       "sasl.oauthbearer.token.endpoint.url with clientId and clientSecret in sasl.jaas.config)")
    del t.out["sasl.login.callback.handler.class"]  # librdkafka's OIDC login is built in: what the class does


def _jaas(t: _Translation, entry: JaasEntry) -> None:
    name = entry.module_name
    options = dict(entry.options)
    key = "sasl.jaas.config"
    mechanism = t.mechanism()

    def unknown() -> None:
        if options:
            raise t.refuse(key, f"{name} option(s) {', '.join(sorted(options))} have no librdkafka equivalent; "
                                "remove them")

    if name in ("PlainLoginModule", "ScramLoginModule"):
        if name == "PlainLoginModule":
            if mechanism is None:
                t.put("sasl.mechanism", "PLAIN", key)
            elif mechanism != "PLAIN":
                raise t.refuse(key, f"PlainLoginModule goes with sasl.mechanism=PLAIN, not {mechanism}")
        elif mechanism not in _SCRAM:
            raise t.refuse(key, f"ScramLoginModule needs sasl.mechanism={' or '.join(_SCRAM)}, "
                                f"{'not ' + mechanism if mechanism else 'which is not given'}")
        if str(options.pop("tokenauth", "false")).lower() == "true":
            raise t.refuse(key, "tokenauth=true (delegation tokens) has no librdkafka equivalent; log in with a "
                                "SCRAM user's name and password")
        for option, setting in (("username", "sasl.username"), ("password", "sasl.password")):
            if option not in options:
                raise t.refuse(key, f"{name} without {option}=\"...\"")
            t.put(setting, options.pop(option), key)
        unknown()
    elif name == "OAuthBearerLoginModule":
        _oauthbearer(t, options, mechanism)
        unknown()
    elif name == "Krb5LoginModule":
        if mechanism not in (None, "GSSAPI"):
            raise t.refuse(key, f"Krb5LoginModule goes with sasl.mechanism=GSSAPI, not {mechanism}")
        if str(options.pop("useTicketCache", "false")).lower() == "true":
            raise t.refuse(key, "useTicketCache=true: librdkafka logs in with kinit from a keytab; give useKeyTab=true "
                                "keyTab=\"...\" principal=\"...\" instead")
        for option, setting in (("principal", "sasl.kerberos.principal"), ("keyTab", "sasl.kerberos.keytab"),
                                ("serviceName", "sasl.kerberos.service.name")):
            if option in options:
                t.put(setting, options.pop(option), key)
        for flag in ("useKeyTab", "storeKey", "doNotPrompt", "debug", "isInitiator"):
            options.pop(flag, None)
        t.out.setdefault("sasl.mechanism", "GSSAPI")
        unknown()
    else:
        raise t.refuse(key, f"librdkafka has no login module {entry.login_module}; it knows PlainLoginModule, "
                            "ScramLoginModule, OAuthBearerLoginModule and Krb5LoginModule (give librdkafka's "
                            "sasl.* settings instead)")


def _oauthbearer(t: _Translation, options: dict[str, str], mechanism: str | None) -> None:
    key = "sasl.jaas.config"
    if mechanism is None:
        t.put("sasl.mechanism", "OAUTHBEARER", key)
    elif mechanism != "OAUTHBEARER":
        raise t.refuse(key, f"OAuthBearerLoginModule goes with sasl.mechanism=OAUTHBEARER, not {mechanism}")
    extensions = {k.removeprefix("extension_"): options.pop(k) for k in sorted(options) if k.startswith("extension_")}
    oidc = {o: options.pop(o) for o in ("clientId", "clientSecret", "scope") if o in options}
    unsecured = {o: options.pop(o) for o in sorted(options) if o.startswith("unsecuredLogin")}
    if oidc:
        if not t.out.get("sasl.oauthbearer.token.endpoint.url"):
            raise t.refuse(key, "clientId/clientSecret need the token endpoint: give "
                                "sasl.oauthbearer.token.endpoint.url")
        for option, setting in (("clientId", "sasl.oauthbearer.client.id"),
                                ("clientSecret", "sasl.oauthbearer.client.secret"),
                                ("scope", "sasl.oauthbearer.scope")):
            if option in oidc:
                t.put(setting, oidc[option], key)
        t.put("sasl.oauthbearer.method", "oidc", key)
        if extensions:
            t.put("sasl.oauthbearer.extensions", ",".join(f"{k}={v}" for k, v in extensions.items()), key)
        return
    if t.out.get("sasl.oauthbearer.token.endpoint.url"):
        raise t.refuse(key, "an OIDC token endpoint is given, but no clientId and clientSecret in "
                            "OAuthBearerLoginModule")
    # Java's default OAUTHBEARER login without a token endpoint: an unsecured JWT, which librdkafka makes too.
    sub = unsecured.pop("unsecuredLoginStringClaim_sub", None)
    if sub is None:
        raise t.refuse(key, "OAuthBearerLoginModule without clientId (OIDC) or unsecuredLoginStringClaim_sub "
                            "(an unsecured token): give one")
    parts = [f"principal={sub}"]
    lifetime = unsecured.pop("unsecuredLoginLifetimeSeconds", None)
    if lifetime is not None:
        parts.append(f"lifeSeconds={lifetime}")
    if unsecured:
        raise t.refuse(key, f"option(s) {', '.join(sorted(unsecured))} have no librdkafka equivalent; remove them")
    parts += [f"extension_{k}={v}" for k, v in extensions.items()]
    t.put("enable.sasl.oauthbearer.unsecure.jwt", "true", key)
    t.put("sasl.oauthbearer.config", " ".join(parts), key)


def _stores(t: _Translation) -> None:
    from controlmsg.kafka.keystores import StoreFormat, key_store_pkcs12, trust_store_pem

    truststore = t.out.get("ssl.truststore.location")
    password = t.take("ssl.truststore.password")
    declared = t.take("ssl.truststore.type")
    if truststore is not None:
        pem = trust_store_pem(str(truststore), password, declared)
        del t.out["ssl.truststore.location"]
        t.put("ssl.ca.location", str(pem), "ssl.truststore.location")
    for java, native in (("ssl.truststore.certificates", "ssl.ca.pem"), ("ssl.keystore.key", "ssl.key.pem"),
                         ("ssl.keystore.certificate.chain", "ssl.certificate.pem")):
        value = t.take(java)
        if value is not None:
            t.put(native, value, java)
    key_type = (t.take("ssl.keystore.type") or "").strip().upper()
    keystore = t.out.get("ssl.keystore.location")
    if keystore is None:
        return
    if key_type == "PEM":  # one PEM file with the key and its certificate chain
        del t.out["ssl.keystore.location"]
        t.put("ssl.certificate.location", keystore, "ssl.keystore.location")
        t.put("ssl.key.location", keystore, "ssl.keystore.location")
        return
    store_password = t.out.get("ssl.keystore.password")
    if store_password is None:
        raise t.refuse("ssl.keystore.location", "a keystore needs ssl.keystore.password")
    path, found = key_store_pkcs12(str(keystore), str(store_password), t.out.get("ssl.key.password"))
    if found is not StoreFormat.PKCS12:
        t.out["ssl.keystore.location"] = str(path)
        t.out.pop("ssl.key.password", None)  # the converted store's keys have the store's password
