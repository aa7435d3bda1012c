"""Whether two output folders of `adjoint explain` hold the same results: the same files, each
the same bytes but for the pictures and the page; each PNG the same pixels (encoders may
differ); index.html the same once its run facts (command line, commit, date, the output
folder's name) and its embedded pictures' bytes are set aside. The folder lock is skipped.
Needs Debian's python3-torchvision (its PNG decoder).

Run: /usr/bin/python3 tools/compare_explain_outputs.py FOLDER_A FOLDER_B
"""
import os
import re
import sys

import torch
from torchvision.io import decode_png


def files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)


def pixels(data):
    return decode_png(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def page_without_run_facts(text, folder):
    text = re.sub(rb'<tr><th>(command line|commit|date)</th><td>.*?</td></tr>', b'', text)
    text = re.sub(rb'data:image/png;base64,[A-Za-z0-9+/=]+', b'PNG', text)
    return text.replace(folder.encode(), b'OUT')


def main():
    a, b = sys.argv[1], sys.argv[2]
    names = files(a)
    if names != files(b):
        sys.exit(f"different files: {sorted(set(names) ^ set(files(b)))}")
    same = pictures = 0
    for name in names:
        x, y = (open(os.path.join(root, name), 'rb').read() for root in (a, b))
        if name == '.lock':  # names the process that held the folder
            continue
        if name.endswith('.png'):
            px, py = pixels(x), pixels(y)
            if px.shape != py.shape or not torch.equal(px, py):
                sys.exit(f"{name}: different pixels")
            pictures += 1
        elif name == 'index.html':
            if page_without_run_facts(x, a) != page_without_run_facts(y, b):
                sys.exit("index.html differs beyond its run facts")
        elif x != y:
            sys.exit(f"{name}: different bytes")
        else:
            same += 1
    print(f"the same results: {same} files the same bytes, {pictures} PNGs the same pixels, "
          f"index.html the same but for its run facts")


if __name__ == "__main__":
    main()
