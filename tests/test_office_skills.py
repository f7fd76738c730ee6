"""The four office flows, end to end through a real ``robot-lab worker`` under bwrap with the
default ceiling, driven by the scripted model: (a) a fillable PDF form sent as an attachment
is filled following the pdf skill's forms.md (``field_values.json`` written with
``write_file``); (b) an xlsx with a formula is created and read back (and recalculated by
LibreOffice where it is installed); (c) a docx is created, then edited through the bundle's
``scripts/office`` unpack/pack scripts; (d) a pptx is created and rendered to an image
(LibreOffice + pdftoppm). Each result file comes back to the publisher in the reply:
inline, or by reference (``robot-lab files get``) past the worker's inline cap.

The bundles are fixtures shaped like the public office skills (tests/fixtures/office_skills).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.office import APP, ROBOT, SKILL_ENV, SKILLS
from tests.test_skills_sandbox import bwrap, needs_bwrap  # noqa: F401 - the fixture is used by name

pypdf = pytest.importorskip("pypdf", reason="pypdf is not installed (pip install -e '.[test]')")
reportlab_canvas = pytest.importorskip("reportlab.pdfgen.canvas", reason="reportlab is not installed")
openpyxl = pytest.importorskip("openpyxl", reason="openpyxl is not installed (pip install -e '.[test]')")
docx = pytest.importorskip("docx", reason="python-docx is not installed (pip install -e '.[test]')")
pptx = pytest.importorskip("pptx", reason="python-pptx is not installed (pip install -e '.[test]')")

pytestmark = [pytest.mark.slow, needs_bwrap, pytest.mark.timeout(300)]  # LibreOffice starts slowly on a loaded box

PDF, DOCX, XLSX, PPTX = (os.path.realpath(SKILLS / n) for n in ("pdf", "docx", "xlsx", "pptx"))
HAS_OFFICE = shutil.which("soffice") is not None and shutil.which("pdftoppm") is not None
NO_OFFICE = "LibreOffice (soffice) or poppler (pdftoppm) is not installed: apt-get install --no-install-recommends " \
            "libreoffice-calc-nogui libreoffice-impress-nogui poppler-utils (.ci/run does)"
INLINE_CAP = 20_000  # the worker's bus.attachment_inline_bytes: a pptx goes by reference

SHEET = """import openpyxl
wb = openpyxl.Workbook()
ws = wb.active
ws.title = "Budget"
ws.append(["item", "cost"])
ws.append(["rent", 1200])
ws.append(["food", 300])
ws["A4"] = "total"
ws["B4"] = "=SUM(B2:B3)"
wb.save("budget.xlsx")
print("saved budget.xlsx")
"""
FIELD_VALUES = [
    {"field_id": "name", "description": "Full name", "page": 1, "value": "Ada Lovelace"},
    {"field_id": "city", "description": "City", "page": 1, "value": "London"},
]
DECK = ("from pptx import Presentation; p = Presentation(); s = p.slides.add_slide(p.slide_layouts[0]); "
        "s.shapes.title.text = 'Quarterly results'; s.placeholders[1].text = 'Up and to the right'; "
        "p.save('deck.pptx'); print('saved deck.pptx')")


def run(command: str) -> dict[str, Any]:
    return {"name": "run_command", "arguments": {"command": command}}


FLOW = {"rules": [
    {"when": {"contains": "fill out the attached PDF form"}, "reply": "{tool_results}", "tool_calls": [
        {"name": "read_skill_file", "arguments": {"skill": "pdf", "path": "FORMS.md"}},  # the file is forms.md
        run(f"python {PDF}/scripts/check_fillable_fields.py form.pdf"),
        run(f"python {PDF}/scripts/extract_form_field_info.py form.pdf field_info.json"),
        {"name": "write_file", "arguments": {"path": "field_values.json", "content": json.dumps(FIELD_VALUES)}},
        run(f"python {PDF}/scripts/fill_fillable_fields.py form.pdf field_values.json filled.pdf"),
    ]},
    {"when": {"contains": "excel spreadsheet"}, "reply": "{tool_results}", "tool_calls": [
        {"name": "write_file", "arguments": {"path": "make_sheet.py", "content": SHEET}},
        run("python make_sheet.py"),
        run("python -c \"import openpyxl; ws = openpyxl.load_workbook('budget.xlsx')['Budget']; "
            "print('B4 =', ws['B4'].value)\""),
    ]},
    {"when": {"contains": "recalculate"}, "reply": "{tool_results}", "tool_calls": [
        run(f"python {XLSX}/scripts/recalc.py budget.xlsx"),
    ]},
    {"when": {"contains": "word document"}, "reply": "{tool_results}", "tool_calls": [
        run("python -c \"from docx import Document; d = Document(); d.add_heading('Memo', 1); "
            "d.add_paragraph('Status: Draft'); d.save('memo.docx'); print('saved memo.docx')\""),
        run(f"python {DOCX}/scripts/office/unpack.py memo.docx unpacked/"),
        run("sed -i 's/Status: Draft/Status: Final/' unpacked/word/document.xml && echo edited"),
        run(f"python {DOCX}/scripts/office/pack.py unpacked/ memo-final.docx --original memo.docx"),
    ]},
    {"when": {"contains": "slide deck"}, "reply": "{tool_results}", "tool_calls": [run(f"python -c \"{DECK}\"")]},
    {"when": {"contains": "render"}, "reply": "{tool_results}", "tool_calls": [
        run(f"python {PPTX}/scripts/thumbnail.py deck.pptx"),
    ]},
]}


class Served:
    """The worker serving the office robot, and a client publishing to it."""

    def __init__(self, url: str, prefix: str, tmp: Path) -> None:
        import redis as redis_lib

        from robot_lab.bus import Bus
        from robot_lab.keys import Keys
        from tests.worker_procs import VENV_BIN, Processes, child_env

        self.url, self.prefix, self.tmp = url, prefix, tmp
        scripts = tmp / "scripts"
        scripts.mkdir()
        (scripts / "office-flow.json").write_text(json.dumps(FLOW))
        self.env = child_env(url, prefix, ROBOT_LAB_SCRIPTS_DIR=str(scripts),
                             ROBOT_LAB_SKILLS__WORKSPACE_ROOT=str(tmp / "worker-workspaces"),
                             ROBOT_LAB_BUS__ATTACHMENT_INLINE_BYTES=str(INLINE_CAP),
                             ROBOT_LAB_SKILLS__SCRIPT_TIMEOUT="120", ROBOT_LAB_SANDBOX__TIMEOUT="120", **SKILL_ENV)
        self.procs = Processes(tmp)
        self.procs.start([str(VENV_BIN / "robot-lab"), "worker", ROBOT, "--app", APP], self.env, "office-worker")
        self.client = redis_lib.Redis.from_url(url)
        self.bus = Bus(self.client, keys=Keys(prefix=prefix))

    def ask(self, text: str, conversation: str, attachments: list[tuple[str, bytes]] | None = None) -> Any:
        from robot_lab.sandbox.workspace import envelope_attachments
        from tests.redis_server import wait_for

        wait_for(lambda: self.bus.exists(ROBOT), timeout=90, interval=0.2)
        extensions = {"attachments": envelope_attachments(attachments)} if attachments else None
        try:
            return self.bus.request(ROBOT, text, conversation_id=conversation, timeout=180, extensions=extensions)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{self.procs.logs()}") from exc

    def files(self, reply: Any) -> dict[str, dict[str, Any]]:
        return {a["name"]: a for a in reply.extensions.get("attachments", [])}

    def close(self) -> None:
        from tests.worker_procs import delete_prefix

        self.procs.kill_all()
        delete_prefix(self.client, self.prefix)
        self.client.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from tests.conftest import _server

    if not _server.url:
        pytest.skip(f"real Redis unavailable: {_server.reason}")
    office = Served(_server.url, f"rltest-office-{uuid.uuid4().hex[:8]}", tmp_path_factory.mktemp("office"))
    try:
        yield office
    finally:
        office.close()


def make_form() -> bytes:
    buffer = io.BytesIO()
    pdf = reportlab_canvas.Canvas(buffer)
    pdf.drawString(50, 760, "Name:")
    pdf.acroForm.textfield(name="name", x=120, y=750, width=240, height=20)
    pdf.drawString(50, 720, "City:")
    pdf.acroForm.textfield(name="city", x=120, y=710, width=240, height=20)
    pdf.save()
    return buffer.getvalue()


def test_a_pdf_form_sent_as_an_attachment_comes_back_filled(served: Served) -> None:
    form = make_form()
    reply = served.ask("Please fill out the attached PDF form: Ada Lovelace, London", "office-pdf",
                       [("form.pdf", form)])
    text = str(reply.content)
    assert "# Fillable fields" in text  # forms.md, asked for as FORMS.md
    assert "This PDF has fillable form fields" in text
    assert "Wrote 2 fields to field_info.json" in text
    assert "Filled 2 fields into filled.pdf" in text, text
    files = served.files(reply)
    assert set(files) == {"field_info.json", "field_values.json", "filled.pdf"}  # not the attachment itself
    filled = served.bus.fetch_file(files["filled.pdf"])
    assert files["filled.pdf"]["media_type"] == "application/pdf" and "content_base64" in files["filled.pdf"]
    values = {k: v.get("/V") for k, v in pypdf.PdfReader(io.BytesIO(filled)).get_fields().items()}
    assert values == {"name": "Ada Lovelace", "city": "London"}
    assert json.loads(served.bus.fetch_file(files["field_values.json"])) == FIELD_VALUES


def test_an_xlsx_with_a_formula_is_created_and_read_back(served: Served) -> None:
    reply = served.ask("Make an excel spreadsheet of my budget with a total formula", "office-xlsx")
    assert "saved budget.xlsx" in str(reply.content)
    assert "B4 = =SUM(B2:B3)" in str(reply.content)  # read back inside the sandbox
    files = served.files(reply)
    assert files["budget.xlsx"]["media_type"] == "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    sheet = openpyxl.load_workbook(io.BytesIO(served.bus.fetch_file(files["budget.xlsx"])))["Budget"]
    assert sheet["B4"].value == "=SUM(B2:B3)" and sheet["B2"].value == 1200
    if not HAS_OFFICE:
        pytest.skip(f"recalculation skipped: {NO_OFFICE}")
    reply = served.ask("Now recalculate its formulas", "office-xlsx")  # the xlsx skill sticks
    line = next((l for l in str(reply.content).splitlines() if '{"status"' in l), None)
    assert line is not None, reply.content
    result = json.loads(line[line.index("{"):])
    assert result["status"] == "success" and result["values"] == {"Budget!B4": 1500}, reply.content
    again = openpyxl.load_workbook(io.BytesIO(served.bus.fetch_file(served.files(reply)["budget.xlsx"])),
                                   data_only=True)
    assert again["Budget"]["B4"].value == 1500


def test_a_docx_is_created_then_edited_through_unpack_and_pack(served: Served) -> None:
    reply = served.ask("Write a word document memo, then edit its status", "office-docx")
    text = str(reply.content)
    assert "saved memo.docx" in text and "Unpacked memo.docx" in text and "edited" in text, text
    assert "Packed unpacked/ into memo-final.docx" in text
    files = served.files(reply)
    assert {"memo.docx", "memo-final.docx", "unpacked/word/document.xml"} <= set(files)
    first = docx.Document(io.BytesIO(served.bus.fetch_file(files["memo.docx"])))
    final = docx.Document(io.BytesIO(served.bus.fetch_file(files["memo-final.docx"])))
    assert [p.text for p in first.paragraphs] == ["Memo", "Status: Draft"]
    assert [p.text for p in final.paragraphs] == ["Memo", "Status: Final"]


def test_a_pptx_is_created_and_rendered_to_an_image(served: Served) -> None:
    reply = served.ask("Create a slide deck presentation of the quarterly results", "office-pptx")
    assert "saved deck.pptx" in str(reply.content)
    deck = served.files(reply)["deck.pptx"]
    assert deck["size"] > INLINE_CAP and "content_base64" not in deck  # by reference: fetched as another process would
    got = subprocess.run([os.path.join(os.path.dirname(os.sys.executable), "robot-lab"), "files", "get", deck["ref"]],
                         env=served.env, capture_output=True, timeout=60)
    assert got.returncode == 0, got.stderr.decode()
    slides = pptx.Presentation(io.BytesIO(got.stdout)).slides
    assert slides[0].shapes.title.text == "Quarterly results"
    if not HAS_OFFICE:
        pytest.skip(f"rendering skipped: {NO_OFFICE}")
    reply = served.ask("Now render the slides to images", "office-pptx")  # the pptx skill sticks
    assert "Rendered 1 slide(s): slide-1.png" in str(reply.content), reply.content
    image = served.files(reply)["slide-1.png"]
    assert image["media_type"] == "image/png"
    png = served.bus.fetch_file(image)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert base64.b64decode(image["content_base64"]) == png if "content_base64" in image else image["ref"]
