"""A small reader for R's serialised objects (XDR format) and lazy-load databases.

Enough of R's serialisation format (R Internals, "Serialization Formats"; src/main/serialize.c)
to read the data sets R packages ship in data/Rdata.rdb + data/Rdata.rdx: character,
logical, integer, double and raw vectors, lists (so data frames, whose columns are a list),
pairlists (attributes) and symbols. Environments, closures and byte code are not needed for
data and raise an error. Python stdlib only.

R values become Python values:
    character vector -> RVector(list of str or None for NA)     (also logical/int/double/raw)
    list (VECSXP)    -> RVector(list of values)
    pairlist         -> RPairList(list of (tag or None, value))
    symbol           -> RSymbol(name)
    NULL             -> None
Attributes (names, class, row.names, ...) are in `.attributes`, a dict tag -> value.

The lazy-load database:
    Rdata.rdx   the index: a serialised list(variables=, references=, compressed=), stored as
                one gzip- (or zlib-) compressed serialisation. `variables` is a named list
                giving, per object name, an integer vector c(offset, length) into Rdata.rdb.
    Rdata.rdb   the objects, concatenated. Each is a block: 4 bytes big-endian *uncompressed*
                length, then (for compressed == TRUE, R's default) a zlib stream holding that
                object's serialisation. compressed == 2 / 3 (bzip2 / xz) put a type byte after
                the length; those are read too.
"""
import bz2
import gzip
import lzma
import struct
import zlib
from pathlib import Path

# SEXP types (serialize.c, Rinternals.h).
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP = 9, 10, 13, 14, 15, 16
DOTSXP, VECSXP, EXPRSXP, RAWSXP, S4SXP = 17, 19, 20, 24, 25
# Pseudo-types used only in the stream.
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP = 255, 254, 253, 252
MISSINGARG_SXP, BASENAMESPACE_SXP, NAMESPACESXP, PACKAGESXP = 251, 250, 249, 248
PERSISTSXP, EMPTYENV_SXP, BASEENV_SXP = 247, 242, 241
ALTREP_SXP = 238

# Bits of the 32-bit flags word that starts every item.
IS_OBJECT_BIT, HAS_ATTR_BIT, HAS_TAG_BIT = 1 << 8, 1 << 9, 1 << 10
LATIN1_MASK, UTF8_MASK, BYTES_MASK = 1 << 2, 1 << 3, 1 << 1   # in the "levels" of a CHARSXP

NA_INTEGER = -(1 << 31)


class RVector(list):
    """An R vector: a list of its elements, plus `.rtype` (SEXP type) and `.attributes`."""

    def __init__(self, items, rtype, attributes=None):
        super().__init__(items)
        self.rtype = rtype
        self.attributes = attributes or {}


class RPairList(list):
    """A pairlist (or language object): a list of (tag, value) pairs."""

    def __init__(self, items, rtype=LISTSXP, attributes=None):
        super().__init__(items)
        self.rtype = rtype
        self.attributes = attributes or {}


class RSymbol(str):
    pass


class XDRReader:
    """Reads one serialisation stream in XDR ("X\\n") format from `data` starting at `pos`."""

    def __init__(self, data, pos=0):
        self.data = data
        self.pos = pos
        self.refs = []   # the reference table: symbols and environments, in order of appearance

    # -- primitives: XDR is big-endian ---------------------------------------------------
    def _take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError("truncated R serialisation")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int(self):
        return struct.unpack(">i", self._take(4))[0]

    def length(self):
        n = self.int()
        if n == -1:   # a long vector: the length follows as two 32-bit halves
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    # -- header --------------------------------------------------------------------------
    def header(self):
        fmt = self._take(2)
        if fmt != b"X\n":
            raise ValueError(f"not an XDR R serialisation (format {fmt!r}); only 'X' is supported")
        version = self.int()
        self.int()   # the R version that wrote it
        self.int()   # the minimal R version that can read it
        if version == 3:   # version 3 names the native encoding of the writer
            self._take(self.int())
        elif version != 2:
            raise ValueError(f"unsupported serialisation version {version}")

    def read(self):
        """Reads the header and the one object that follows; returns the object."""
        self.header()
        return self.item()

    # -- items ---------------------------------------------------------------------------
    def attributes(self):
        """The attribute pairlist as a dict tag -> value."""
        plist = self.item()
        return {tag: value for tag, value in plist} if plist else {}

    def charsxp(self, levels):
        n = self.int()
        if n == -1:
            return None   # NA_character_
        raw = self._take(n)
        if levels & LATIN1_MASK:
            return raw.decode("latin-1")
        if levels & BYTES_MASK:
            return raw.decode("utf-8", "replace")
        return raw.decode("utf-8")   # UTF-8, ASCII, or native (UTF-8 on Debian)

    def item(self):
        flags = self.int()
        sexptype = flags & 0xFF
        levels = flags >> 12
        has_attr = bool(flags & HAS_ATTR_BIT)
        has_tag = bool(flags & HAS_TAG_BIT)

        # Values that are only a flags word.
        if sexptype in (NILVALUE_SXP, NILSXP):
            return None
        if sexptype in (GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP, BASENAMESPACE_SXP,
                        EMPTYENV_SXP, BASEENV_SXP):
            return RSymbol(f"<special {sexptype}>")
        if sexptype == REFSXP:   # a back-reference into the table; index 0 means "read it"
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if sexptype in (PERSISTSXP, NAMESPACESXP, PACKAGESXP):
            # A string vector naming the object: 0, length, then CHARSXP items.
            if self.int() != 0:
                raise ValueError("bad persistent string vector")
            names = [self.item() for _ in range(self.int())]
            value = RSymbol(f"<{sexptype}:{':'.join(n or '' for n in names)}>")
            self.refs.append(value)
            return value
        if sexptype == SYMSXP:
            value = RSymbol(self.item())   # the printname, a CHARSXP
            self.refs.append(value)
            return value
        if sexptype == ALTREP_SXP:
            # A compact representation (e.g. 1:n row names): class info, state, attributes.
            # We return the state, which for compact sequences is c(length, start, step).
            self.item()
            state = self.item()
            self.item()
            return state
        if sexptype in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP):
            # Pairlist cells: [attributes] [tag] car cdr; walk the cdr chain iteratively.
            items, attributes, rtype = [], {}, sexptype
            while True:
                if has_attr:
                    attributes.update(self.attributes())
                tag = self.item() if has_tag else None
                items.append((tag, self.item()))
                flags = self.int()
                sexptype = flags & 0xFF
                if sexptype in (LISTSXP, LANGSXP, DOTSXP):
                    has_attr, has_tag = bool(flags & HAS_ATTR_BIT), bool(flags & HAS_TAG_BIT)
                    continue
                # The cdr is not a cell: step back and read it as an ordinary item.
                self.pos -= 4
                tail = self.item()
                if tail is not None:
                    items.append((None, tail))
                return RPairList(items, rtype, attributes)
        if sexptype == CHARSXP:
            return self.charsxp(levels)

        # Vectors: length, elements, then [attributes].
        if sexptype in (LGLSXP, INTSXP):
            n = self.length()
            values = [None if v == NA_INTEGER else v for v in struct.unpack(f">{n}i", self._take(4 * n))]
        elif sexptype == REALSXP:
            n = self.length()
            values = list(struct.unpack(f">{n}d", self._take(8 * n)))
        elif sexptype == CPLXSXP:
            n = self.length()
            parts = struct.unpack(f">{2 * n}d", self._take(16 * n))
            values = [complex(parts[2 * i], parts[2 * i + 1]) for i in range(n)]
        elif sexptype == RAWSXP:
            values = list(self._take(self.length()))
        elif sexptype == STRSXP:
            values = []
            for _ in range(self.length()):
                f = self.int()   # each element is a CHARSXP item with its own flags
                if f & 0xFF != CHARSXP:
                    raise ValueError(f"string vector element of type {f & 0xFF}")
                values.append(self.charsxp(f >> 12))
        elif sexptype in (VECSXP, EXPRSXP):
            values = [self.item() for _ in range(self.length())]
        elif sexptype == S4SXP:
            values = []
        else:
            raise ValueError(f"R object type {sexptype} is not supported by this reader")
        attributes = self.attributes() if has_attr else {}
        return RVector(values, sexptype, attributes)


def unserialize(data):
    """One serialised R object (bytes, already decompressed) -> Python value."""
    return XDRReader(data).read()


def named(vector):
    """A named R list/vector -> dict name -> element (in order)."""
    return dict(zip(vector.attributes["names"], vector))


def _decompress_block(block):
    """One lazy-load block: 4-byte big-endian uncompressed length, then the compressed data."""
    size = struct.unpack(">I", block[:4])[0]
    body = block[4:]
    if body[:1] == b"\x78":   # zlib header (compressed = TRUE)
        data = zlib.decompress(body)
    elif body[:1] in (b"2", b"Z"):   # compressed = 2 (bzip2) or 3 (xz); "0" would be stored
        data = bz2.decompress(body[1:]) if body[:1] == b"2" else lzma.decompress(body[1:])
    elif body[:1] == b"0":
        data = body[1:]
    else:
        raise ValueError("unknown lazy-load block compression")
    if len(data) != size:
        raise ValueError(f"lazy-load block: expected {size} bytes, got {len(data)}")
    return data


def read_lazyload(rdb_path):
    """Reads every object of an R lazy-load database (path to the .rdb; the .rdx beside it).
    Returns a dict object name -> value, in the index's order."""
    rdb_path = Path(rdb_path)
    raw_index = rdb_path.with_suffix(".rdx").read_bytes()
    if raw_index[:2] == b"\x1f\x8b":
        index_data = gzip.decompress(raw_index)
    else:   # a bare lazy-load block
        index_data = _decompress_block(raw_index)
    index = named(unserialize(index_data))
    rdb = rdb_path.read_bytes()
    objects = {}
    for name, (offset, size) in named(index["variables"]).items():
        objects[name] = unserialize(_decompress_block(rdb[offset:offset + size]))
    return objects
