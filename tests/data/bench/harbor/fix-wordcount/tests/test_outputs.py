import subprocess
import sys


def test_counts_words(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("one two three\nfour five\n")
    out = subprocess.run([sys.executable, "/app/wordcount.py", str(f)], capture_output=True, text=True)
    assert out.stdout.strip() == "5"
