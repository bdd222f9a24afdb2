#!/bin/sh
# Builds bench_kraken_quality's English corpus from a Debian package: the
# Debian Administrator's Handbook (package debian-handbook 11.20220922, Debian
# 12 bookworm, main), its en-US HTML pages in reading order (index.html then
# each page's rel="next" link) turned into plain text by Python's standard
# html.parser: page chrome (banner, Prev/Next links, tables of contents,
# scripts, styles) dropped, one blank line between blocks, runs of blanks
# squeezed. Same package version, same bytes (the sha256 printed at the end:
# 1c27b554... for 11.20220922, 1,132,691 bytes).
#
#   bench/kraken_corpus.sh [OUT]      (default /tmp/loom-kraken/debian-handbook.txt)
set -eu
out=${1:-/tmp/loom-kraken/debian-handbook.txt}
version=11.20220922
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "debian-handbook=$version" >/dev/null)
dpkg -x "$work"/debian-handbook_${version}_all.deb "$work/root"
mkdir -p "$(dirname "$out")"
/usr/bin/python3 - "$work/root/usr/share/doc/debian-handbook/html/en-US" "$out" <<'PY'
import html.parser, os, re, sys

root, out = sys.argv[1], sys.argv[2]
BLOCKS = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "tr", "pre", "dt", "dd", "br", "table", "blockquote"}
VOID = {"br", "img", "meta", "link", "hr", "input", "col", "area", "base", "wbr"}
SKIPPED_IDS = {"banner"}
SKIPPED_CLASSES = {"docnav", "navheader", "navfooter", "toc", "list-of-figures", "list-of-tables", "list-of-examples"}

class Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.stack, self.skip_depth, self.next = [], [], 0, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "link" and a.get("rel") == "next":
            self.next = a.get("href")
        if tag in VOID:
            if tag == "br":
                self.parts.append("\n")
            return
        skip = tag in ("script", "style", "head") or a.get("id") in SKIPPED_IDS or \
            bool(SKIPPED_CLASSES & set((a.get("class") or "").split()))
        self.stack.append(skip)
        if skip:
            self.skip_depth += 1
        if tag in BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in VOID or not self.stack:
            return
        if self.stack.pop():
            self.skip_depth -= 1
        if tag in BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if self.skip_depth == 0:
            self.parts.append(data)

def page_text(name):
    parser = Text()
    with open(os.path.join(root, name), encoding="utf-8") as f:
        parser.feed(f.read())
    blocks = re.split(r"\n\s*\n", "".join(parser.parts))
    lines = [re.sub(r"[ \t\r\f\v]+", " ", b.strip()) for b in blocks]
    return "\n\n".join(l for l in lines if l), parser.next

pages, name, seen = [], "index.html", set()
while name and name not in seen:
    seen.add(name)
    text, name = page_text(name)
    pages.append(text)
with open(out, "w", encoding="utf-8") as f:
    f.write("\n\n".join(pages) + "\n")
print(f"{out}: {len(seen)} pages, {os.path.getsize(out)} bytes", file=sys.stderr)
PY
sha256sum "$out"
