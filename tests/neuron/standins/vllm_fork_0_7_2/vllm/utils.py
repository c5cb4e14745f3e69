"""Stand-in of the fork's vllm/utils.py: only FlexibleArgumentParser (an argparse parser)."""

import argparse


class FlexibleArgumentParser(argparse.ArgumentParser):
    pass
