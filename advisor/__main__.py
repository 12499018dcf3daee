from kvadvise.cli import run

run()
