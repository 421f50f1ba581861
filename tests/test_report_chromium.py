"""The report as a reader sees it: rendered by headless Chromium (Debian's `chromium`), every request
the page makes caught by a proxy on loopback, the rendered DOM's text, a screenshot, the PDF's pages
rendered by poppler (`pdftoppm`, `pdftotext`)."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from patcher import report
from tests.test_report import RECORDED, assert_self_contained, recertify
from tests.test_sbom_standin import standin_certified  # noqa: F401 - the session fixture


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: .ci/install-host.sh installs chromium and poppler-utils")


def chromium(args: list[str], profile: Path, timeout: int = 120) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run headless Chromium with nothing able to leave (all traffic to a dead proxy port) and its
    NetLog on; returns (the process, every URL the *page* asked for).  The browser's own background
    requests (update checks, time, sign-in) carry the initiator "not an origin"; a request the page
    makes carries the page's origin ("null" for a file:// page)."""
    exe = report.chromium_binary()
    netlog = profile.with_suffix(".netlog.json")
    argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
            f"--log-net-log={netlog}", f"--user-data-dir={profile}", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={"HOME": str(profile), "PATH": "/usr/bin:/bin"})
    log = json.loads(netlog.read_text())
    names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    asked = []
    for event in log["events"]:
        params = event.get("params") or {}
        if names.get(event["type"]) == "URL_REQUEST_START_JOB" and params.get("initiator") not in (None, "not an origin"):
            asked.append(params.get("url"))
    return proc, asked


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of a non-interlaced 8-bit PNG (Chromium's and poppler's)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _c, _f, interlace = struct.unpack(">IIBBBBB", chunk)
            assert depth == 8 and interlace == 0 and colour in (2, 6), (depth, colour, interlace)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    if bpp == 4:
        rows = [bytes(b for i, b in enumerate(r) if i % 4 != 3) for r in rows]
    return width, height, rows


def colour_share(rows: list[bytes], rgb: tuple[int, int, int], tol: int = 24) -> float:
    hits = total = 0
    for row in rows[::2]:
        for i in range(0, len(row), 6):
            total += 1
            if all(abs(row[i + k] - rgb[k]) <= tol for k in range(3)):
                hits += 1
    return hits / max(total, 1)


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("style", "title")

    def handle_endtag(self, tag):
        self._skip -= tag in ("style", "title")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def render_and_check(html_path: Path, tmp_path: Path, facts: list[str], banner_rgb: tuple[int, int, int]) -> str:
    """Load the page in Chromium: no request, the DOM's text, internal links, a screenshot."""
    _need("chromium")
    url = html_path.resolve().as_uri()
    dom, asked = chromium(["--dump-dom", url], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert asked == [], f"the page made requests: {asked}"      # nothing left the page
    shot = tmp_path / "screen.png"
    res, asked = chromium(["--window-size=1280,1000", "--hide-scrollbars", f"--screenshot={shot}", url],
                          tmp_path / "profile-shot")
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    assert asked == [], f"the page made requests: {asked}"
    # the rendered DOM: the key facts are there as text a reader sees
    parser = _Text()
    parser.feed(dom.stdout)
    text = re.sub(r"\s+", " ", " ".join(parser.parts))
    for fact in facts:
        assert fact in text, fact
    refs = assert_self_contained(dom.stdout)       # no broken internal link in what Chromium built
    assert {"verdict", "checks", "patches", "probe", "sbom", "verify"} <= refs.ids
    # the screenshot: a real page, the verdict banner's colour on the first screen
    width, height, rows = png_pixels(shot)
    assert (width, height) == (1280, 1000)
    assert colour_share(rows[:300], banner_rgb) > 0.02
    assert colour_share(rows, (255, 255, 255), tol=3) < 0.97          # not blank
    return text


def check_pdf(pdf: Path, tmp_path: Path, facts: list[str]) -> int:
    _need("pdftoppm", "pdftotext")
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    flat = re.sub(r"\s+", " ", text)
    for fact in facts:
        assert fact in flat, fact
    subprocess.run(["pdftoppm", "-r", "30", "-png", str(pdf), str(tmp_path / "page")], check=True)
    pages = sorted(tmp_path.glob("page-*.png"))
    assert pages
    for page in pages:
        _w, _h, rows = png_pixels(page)
        assert colour_share(rows, (255, 255, 255), tol=3) < 0.995, page.name   # every page has content
    return len(pages)


GREEN, AMBER, RED = (0x1A, 0x7F, 0x37), (0x9A, 0x67, 0x00), (0xCF, 0x22, 0x2E)


def test_the_request_check_sees_what_a_page_asks_for(tmp_path):
    """The NetLog check is not vacuous: a page with an outside image and style sheet is caught."""
    _need("chromium")
    page = tmp_path / "leaky.html"
    page.write_text('<html><body>x<img src="http://leak.patcher.invalid/a.png">'
                    '<link rel="stylesheet" href="https://leak.patcher.invalid/b.css"></body></html>')
    _proc, asked = chromium(["--dump-dom", page.as_uri()], tmp_path / "profile")
    assert set(asked) == {"http://leak.patcher.invalid/a.png", "https://leak.patcher.invalid/b.css"}


def test_certified_bundle_report_reads_right_in_chromium_and_as_pdf(certified_bundle, tmp_path):
    b = certified_bundle
    recertify(b, tmp_path)   # every patch's own probe checks pass, no advisory open at CVSS >= 7: green
    result = report.write_report(b.wheel, out=tmp_path / "report.html", pdf=True, public_key=b.public_key,
                                 catalog=b.catalog)
    assert result.verdict == "verified", result.checks
    facts = ["Signature verified.", b.wheel.name, "PT-0001", "maxpool2d.nhwc_large_channels", "Verify it yourself",
             "patcher verify", "The verdict is the worst of its parts"]
    render_and_check(result.html, tmp_path, facts, GREEN)
    assert check_pdf(result.pdf, tmp_path, facts) >= 1
    assert not list(result.pdf.parent.glob(".*.tmp"))        # the PDF was printed to a temp name, then moved


@pytest.mark.docker
@pytest.mark.slow
def test_standin_build_report_reads_right_in_chromium(standin_certified, tmp_path):  # noqa: F811
    s = standin_certified
    result = report.write_report(s.build_dir, pdf=True, public_key=s.public_key, catalog=s.catalog)
    assert result.html == s.wheel.with_name(s.wheel.name + report.REPORT_SUFFIX)
    # verified evidence of a wheel that is not good: its probe report (make_probe_report) runs none of
    # PT-0090's own checks, and it carries none of 1.4.0's security patches, so its VEX has exploitable ones
    assert result.verdict == "failed", result.checks
    status = {c.name: c.status for c in result.checks}
    assert status["signature"] == status["wheel"] == status["SBOM"] == status["probe report"] == "ok"
    assert status["patch proofs"] == "unproven" and status["advisories"] == "failed"
    facts = ["this wheel FAILS a check", "CVE-2022-45907", s.wheel.name, s.record["wheel"]["sha256"], "PT-0090",
             "libstdc++.so.6", "libstdc++6", "reproducible true", "third_party/dep", "Builder image scan",
             f"names the builder image's {len(s.inventory.packages)} Debian packages"]
    render_and_check(result.html, tmp_path, facts, RED)
    check_pdf(result.pdf, tmp_path, ["this wheel FAILS a check", "PT-0090", "libstdc++.so.6"])


def test_recorded_1131_report_is_committed_and_reads_right(tmp_path):
    """evidence/runs/torch-1.13.1-cpu/report/: the page of the recorded build, made by
    `patcher report evidence/runs/torch-1.13.1-cpu --key .../signing-key.pub.pem` (the checkout's catalog:
    the patches' subjects from its history, matched by the signed sha256), and its first screen."""
    committed = RECORDED.parent / "report" / "report.html"
    assert (RECORDED.parent / "report" / "first-screen.png").is_file()
    text = render_and_check(committed, tmp_path, ["not everything is proven", "PT-0101", "v1.13.1",
                                                  "The wheel is not here.", "security.cve_2024_31580",
                                                  "jit: parse type comments as type expressions, never run them",
                                                  "matched by sha256 in the catalog for 13",
                                                  "2dd83d5fd0b91c075f8c0d5692e01ada016deed675ac56e4e8b33014cb21c87a"],
                            AMBER)
    assert "NOT VERIFIED" not in text and "unreadable" not in text
    # the committed page is the one the report command makes today from the same signed evidence
    root = RECORDED.parents[3]
    fresh = report.write_report(RECORDED.parent, out=tmp_path / "fresh.html",
                                public_key=RECORDED / "signing-key.pub.pem", catalog=root)
    assert fresh.html.read_text().replace(f"{root}/", "") == committed.read_text()
