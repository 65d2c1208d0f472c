"""`viz all`: index.html shows every figure made (each <img> resolves, no external reference) and one
line for each figure it could not make."""
import re

from attnlab.viz import gallery


def test_gallery_page(tmp_path, monkeypatch):
    jobs = dict(gallery.JOBS)
    monkeypatch.setattr(gallery, "JOBS", [(k, jobs[k]) for k in ("attention", "positions", "schedule", "moe", "bpe",
                                                                  "teacher-forcing")])
    result = gallery.make_all(tmp_path / "g", runs=[])
    page = (tmp_path / "g" / "index.html").read_text()
    assert "http" not in page
    images = re.findall(r'<img src="([^"]+)"', page)
    assert len(images) == len(result.figures) >= 3
    for src in images:
        assert (tmp_path / "g" / src).is_file() and not src.startswith("/")
    for link in re.findall(r'<a href="([^"]+)"', page):
        assert (tmp_path / "g" / link).is_file() and "http" not in (tmp_path / "g" / link).read_text()
    skipped = "\n".join(result.skipped)
    assert "moe: no mixture-of-experts run among the runs; make a mixture-of-experts run, e.g. attnlab train" in skipped
    assert "teacher-forcing: no translation run among the runs; make one with: attnlab train --recipe multi30k-en-de" \
        in skipped
    assert page.count("<li>") == len(result.skipped) == 2


def test_find_runs(tmp_path):
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    assert [p.name for p in gallery.find_runs(tmp_path)] == ["a", "b"]
    assert gallery.find_runs(tmp_path / "missing") == []
