"""Error signatures: what failure triage groups failed tasks by.

A task's stored error (``error_msg``) is ``"<ExceptionClass>: <message>"`` when
asyncq wrote it (see :func:`asyncq._logging.error_text`) and any text when Go
asynq did. Two failures have the same *signature* when their exception type
is the same and their messages are equal once the parts that vary from one
occurrence to the next are folded into placeholders:

* quoted strings (``'...'`` or ``"..."``, not an apostrophe inside a word) -> ``'<str>'``,
  except a name the message labels as a field, argument, parameter, attribute, column
  or option (``payload field 'user_id'``, ``no attribute 'total'``, ``missing 1
  required positional argument: 'x'``): that name says *which* one failed, so it is
  kept, with only the list indices of a dotted path (``'items.3.sku'``) folded to ``<n>``
* UUIDs -> ``<uuid>``
* IPv4 addresses with an optional port, bracketed IPv6 addresses with a port,
  and bare IPv6 addresses -> ``<ip>``
* hex ids (``0x...``, or 8+ hex digits mixing digits and letters) -> ``<hex>``
* numbers not following a letter (``42``, ``-3.5``, ``1e9``, ``30s``, versions
  ``1.2.3``; the ``2`` of ``HTTP2`` stays) -> ``<n>``

then runs of whitespace become one space and the message is cut at
:data:`MAX_MESSAGE` characters. Everything here is pure and idempotent:
normalising a normalised message changes nothing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = ["MAX_MESSAGE", "ErrorSignature", "error_signature", "normalise_message", "split_error"]

MAX_MESSAGE = 240
"""Characters of the normalised message kept in a signature (long messages share a prefix)."""

# A Python class name (optionally dotted, the last part capitalised) followed by ": ".
# Go errors ("dial tcp ...: connection refused", "asynq: task canceled") are lower-case
# prefixes and stay whole messages without a type.
_TYPE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::(?:\s+|$)|$)")

_QUOTED = re.compile(r"""(?<!\w)(?:'[^'\n]*'|"[^"\n]*")(?!\w)""")
_UUID = re.compile(
    r"(?<![0-9A-Za-z])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"(?![0-9A-Za-z])"
)
_IPV4 = r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?(?!\d)(?!\.\d)"
_IPV6_BRACKETED = r"\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\](?::\d{1,5})?(?!\d)"
# Bare IPv6: all eight groups, or a "::" abbreviation.
_IPV6_BARE = (
    r"(?<![\w:.])(?:(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}"
    r"|(?:[0-9A-Fa-f]{1,4}:){1,7}:(?:[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4}){0,6})?"
    r"|::[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{1,4}){0,6})(?![\w:])"
)
# The leading lookahead lets the engine skip most positions at once (5x faster).
_IP = re.compile(f"(?=[\\[0-9A-Fa-f:])(?:{_IPV6_BRACKETED}|{_IPV4}|{_IPV6_BARE})")
_HEX = re.compile(
    r"(?<!\w)(?=[0-9a-fA-F])"
    r"(?:0[xX][0-9a-fA-F]+|(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,})(?!\w)"
)
_NUMBER = re.compile(r"(?<![A-Za-z\d.])[-+]?\d+(?:\.\d+)*(?:[eE][-+]?\d+)?(?!\d)")
# A quoted name kept whole: an identifier, or a dotted path of them and list indices
# (pydantic's locations; ``<n>``, an index folded already), right after a word labelling
# it as one.
_LABEL_WORD = re.compile(r"field|argument|parameter|attribute|column|option")
_LABEL_BEFORE = re.compile(r"(?<!\S)(?:field|argument|parameter|attribute|column|option):?\s+\Z")
_NAME = re.compile(r"[A-Za-z_]\w*(?:\.(?:[A-Za-z_]\w*|\d+|<n>))*")
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|\Z)")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class ErrorSignature:
    """The exception type and the normalised message of a failure."""

    kind: str
    """The exception class (``"ValueError"``, ``"httpx.ConnectError"``); empty when the
    error text names none (Go errors, asyncq's own errors)."""
    message: str
    """The message with its varying parts folded (see the module docs)."""

    @property
    def key(self) -> str:
        """A short stable id of the signature (12 hex digits), for URLs and commands."""
        digest = hashlib.sha256(f"{self.kind}\0{self.message}".encode()).hexdigest()
        return digest[:12]

    def __str__(self) -> str:
        if self.kind and self.message:
            return f"{self.kind}: {self.message}"
        return self.kind or self.message


def split_error(text: str) -> tuple[str, str]:
    """``"KeyError: 'x'"`` -> ``("KeyError", "'x'")``; without a class prefix ``("", text)``."""
    text = text.strip()
    match = _TYPE.match(text)
    if match is None:
        return "", text
    return match.group(1), text[match.end() :].strip()


def _fold(text: str) -> str:
    out = _QUOTED.sub("'<str>'", text)
    out = _UUID.sub("<uuid>", out)
    out = _IP.sub("<ip>", out)
    out = _HEX.sub("<hex>", out)
    out = _NUMBER.sub("<n>", out)
    return _SPACE.sub(" ", out)


def _kept_name(message: str, quoted: re.Match[str]) -> str | None:
    """The quoted string *quoted* as kept (its list indices folded), or None to fold it."""
    text = quoted.group()
    name = text[1:-1]
    start = quoted.start()
    if _NAME.fullmatch(name) is None:
        return None
    if not _LABEL_BEFORE.search(message, max(0, start - 40), start):
        return None
    return text[0] + _INDEX.sub("<n>", name) + text[0]


def normalise_message(message: str) -> str:
    """*message* with quoted strings, UUIDs, addresses, hex ids and numbers folded; the
    names of fields, arguments and the like kept."""
    out = ""
    if _LABEL_WORD.search(message):
        pos = 0
        for quoted in _QUOTED.finditer(message):
            name = _kept_name(message, quoted)
            if name is None:
                continue
            # The text between kept names is folded on its own: a kept name ends the
            # quoted strings, numbers and ids before it as the end of the text would.
            out += _fold(message[pos : quoted.start()])
            if len(out.lstrip()) + len(name) > MAX_MESSAGE:
                # Cut short, the name would fold differently when normalised again.
                return out.strip()[:MAX_MESSAGE].rstrip()
            out += name
            pos = quoted.end()
        message = message[pos:]
    out = (out + _fold(message)).strip()
    return out[:MAX_MESSAGE].rstrip()


def error_signature(error: str) -> ErrorSignature:
    """The signature of a stored error text (``TaskInfo.last_error``)."""
    kind, message = split_error(error)
    return ErrorSignature(kind, normalise_message(message))
