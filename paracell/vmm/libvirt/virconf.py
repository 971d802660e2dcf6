"""libvirt's configuration file syntax (virConf, src/util/virconf.c), read
the way libvirt reads it, for the few qemu.conf settings ParaCell checks.

Statements are `name = value`, separated by a newline or ';', with '#'
comments. A value is an integer, a string ('...', "..." or \"\"\"...\"\"\",
no escapes) or a list of values in [...] that may span lines. The first
statement of a name wins, as in virConfGetValue. A file libvirt could not
parse would not have let the daemon start, so a syntax error here is a
ParacellError and the caller reports the setting as unverified.
"""

from __future__ import annotations

import re

from paracell.errors import ParacellError

# libvirt's own limit (MAX_CONFIG_FILE_SIZE).
MAX_FILE = 10 << 20
Value = int | str | list["Value"]
_BLANK = " \t"
_EOL = "\r\n"
# A comment runs to the end of its line: found at once, not a character at
# a time (Debian's qemu.conf is 36 KiB of comments).
_NEXT_EOL = re.compile("[\r\n]")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.pos, self.line = text, 0, 1

    def fail(self, what: str) -> ParacellError:
        return ParacellError(f"line {self.line}: {what}")

    @property
    def cur(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip(self, chars: str) -> None:
        while self.cur and self.cur in chars:
            self.line += self.cur == "\n"
            self.pos += 1

    def until_eol(self) -> None:
        eol = _NEXT_EOL.search(self.text, self.pos)
        self.pos = eol.start() if eol else len(self.text)

    def string(self) -> str:
        if self.text.startswith('"""', self.pos):
            end = self.text.find('"""', self.pos + 3)
            if end < 0:
                raise self.fail("unterminated string")
            value = self.text[self.pos + 3:end]
            self.line += value.count("\n")
            self.pos = end + 3
            return value
        quote = self.cur
        self.pos += 1
        start = self.pos
        while self.cur and self.cur != quote and self.cur not in _EOL:
            self.pos += 1
        if self.cur != quote:
            raise self.fail("unterminated string")
        self.pos += 1
        return self.text[start:self.pos - 1]

    def value(self) -> Value:
        self.skip(_BLANK)
        if self.cur in ("'", '"'):
            return self.string()
        if self.cur == "[":
            self.pos += 1
            items: list[Value] = []
            self.skip(_BLANK + _EOL)
            while self.cur != "]":
                if items:
                    if self.cur != ",":
                        raise self.fail("expecting a separator in list")
                    self.pos += 1
                    self.skip(_BLANK + _EOL)
                    if self.cur == "]":
                        break
                if not self.cur:
                    raise self.fail("list is not closed with ]")
                items.append(self.value())
                self.skip(_BLANK + _EOL)
            self.pos += 1
            return items
        start = self.pos
        if self.cur in ("-", "+"):
            self.pos += 1
        digits = self.pos
        while self.cur.isdigit() and self.cur.isascii():
            self.pos += 1
        if self.pos == digits:
            raise self.fail("expecting a value")
        return int(self.text[start:self.pos])

    def statements(self) -> dict[str, Value]:
        found: dict[str, Value] = {}
        while True:
            self.skip(_BLANK + _EOL)
            if not self.cur:
                return found
            if self.cur == "#":
                self.until_eol()
                continue
            start = self.pos
            if not (self.cur.isascii() and self.cur.isalpha()):
                raise self.fail("expecting a name")
            while self.cur and self.cur.isascii() and (self.cur.isalnum() or self.cur == "_"):
                self.pos += 1
            name = self.text[start:self.pos]
            self.skip(_BLANK)
            if self.cur != "=":
                raise self.fail("expecting an assignment")
            self.pos += 1
            value = self.value()
            found.setdefault(name, value)
            self.skip(_BLANK)
            if self.cur == "#":
                self.until_eol()
            if self.cur == ";":
                self.pos += 1
            elif self.cur and self.cur not in _EOL:
                raise self.fail("expecting a separator")


def parse(text: str) -> dict[str, Value]:
    """Each setting's value, the first of its name winning."""
    if len(text) > MAX_FILE:
        raise ParacellError(f"over {MAX_FILE >> 20} MiB")
    return _Parser(text).statements()
