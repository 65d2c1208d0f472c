"""Bad input is a UserError (or an OSError): one line and exit 2 on the command line, the flag named
as the command spells it; any other exception is a bug and keeps its traceback."""
import subprocess
import sys
import textwrap

import pytest

from attnlab.cli import build_parser, error_line, main
from attnlab.cli.args import flags_of
from attnlab.errors import NonFiniteError, UnknownName, UserError, naming
from attnlab import load as load_module
from attnlab.load import load_model
from attnlab.tasks.registry import evaluate_run
from attnlab.train.run_dir import check_out_dir
from tests.tasks.test_new_family import bigram_family, trained_bigram


def test_user_errors_are_the_builtin_errors_callers_expect():
    assert issubclass(UserError, ValueError)
    assert issubclass(UnknownName, KeyError) and str(UnknownName("token 'x' is unknown")) == "token 'x' is unknown"
    assert issubclass(NonFiniteError, FloatingPointError) and issubclass(NonFiniteError, UserError)


def test_library_messages_name_parameters_and_the_cli_writes_flags(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileExistsError) as e:
        check_out_dir(tmp_path, resume=False)
    assert str(e.value).startswith(f"out={tmp_path} holds trained weights") and "--" not in str(e.value)
    with pytest.raises(UserError, match=r"^dtype='q5_k' is not supported; supported: auto, fp32") as e:
        load_model("smollm2-135m", "q5_k")
    train = flags_of(build_parser().parse_args(["train", "--recipe", "x"]))
    evaluate = flags_of(build_parser().parse_args(["evaluate", "--model", "x"]))
    convert = flags_of(build_parser().parse_args(["convert", "--from", "a", "--to", "b"]))
    assert error_line(e.value, evaluate) == "--dtype 'q5_k' is not supported; supported: auto, fp32, bf16, q8_0, " \
                                            "q4_0, q4_1"
    resume = naming(FileExistsError("out=runs/out=x already holds a run; pass resume=True to continue it"),
                    "out", "resume")
    assert error_line(resume, train) == "--out runs/out=x already holds a run; pass --resume to continue it"
    quantize = UserError("quantize='q8_0' applies to GGUF output only (out_dir=FILE.gguf)", param=("quantize", "out_dir"))
    assert error_line(quantize, convert) == "--quantize 'q8_0' applies to GGUF output only (--to FILE.gguf)"
    assert error_line(UserError("beam=2 does not apply", param="beam"), train) == "beam=2 does not apply"  # no flag


def test_an_option_of_another_family_is_refused_in_one_line_naming_the_flag(tiny_shakespeare, tmp_path, capsys):
    with bigram_family():  # a tiny causal LM family (tests/tasks/test_new_family.py), trained in seconds
        run = trained_bigram(tmp_path, steps=2)
        with pytest.raises(UserError, match=r"^beam=2 does not apply to a bigram model"):
            evaluate_run(run, beam=2)
        capsys.readouterr()
        assert main(["evaluate", "--model", str(run), "--beam", "2"]) == 2
    assert capsys.readouterr().err == f"attnlab: error: --beam 2 does not apply to a bigram model ({run})\n"


def test_a_bug_inside_a_command_keeps_its_traceback(monkeypatch):
    import attnlab.cli.models as commands

    def broken(*args, **kwargs):
        return {}["missing"]  # a genuine bug: a KeyError deep inside a command

    monkeypatch.setattr(commands, "convert", broken)
    with pytest.raises(KeyError, match="missing"):
        main(["convert", "--from", "x", "--to", "y"])


def test_a_bug_prints_its_traceback_and_bad_input_one_line():
    script = textwrap.dedent("""
        import sys
        import attnlab.cli.models as commands
        from attnlab.cli import main
        commands.convert = lambda *a: 1 / 0
        sys.exit(main(sys.argv[1:]))
    """)
    bug = subprocess.run([sys.executable, "-c", script, "convert", "--from", "x", "--to", "y"], capture_output=True,
                         text=True, timeout=120)
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "ZeroDivisionError" in bug.stderr
    bad = subprocess.run([sys.executable, "-m", "attnlab", "generate", "--model", "/no/such/model", "--prompt", "a"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("native", [False, True])
def test_bf16_weights_on_a_cpu_without_native_bf16_say_they_are_slow(tiny_shakespeare, tmp_path, capsys, monkeypatch,
                                                                       native):
    """--dtype bf16 where the CPU has no bf16 products ran at ~1 tok/s with no word (a new user's report):
    load_model says so in one stderr line, and only there."""
    monkeypatch.setattr(load_module, "native_bf16", lambda: native)
    with bigram_family():
        out = trained_bigram(tmp_path, steps=2)
        capsys.readouterr()
        load_model(str(out), "bf16")
        load_model(str(out), "fp32")
    err = capsys.readouterr().err
    assert ("without native bf16 products" in err) is not native and err.count("bf16 products") <= 1
