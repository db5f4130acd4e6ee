#!/usr/bin/env python3
"""Turns a tmux screen capture with escapes (`tmux capture-pane -p -e`) into HTML, for
chromium to take a PNG of (the README's screen of `top`, docs/img/top.png):

    python3 tools/screen_png.py screen.ansi > /tmp/top.html
    chromium --headless --no-sandbox --hide-scrollbars --window-size=1200,250 \
        --screenshot=docs/img/top.png file:///tmp/top.html

Only what ratatui writes is read: SGR bold, reverse and the 16 colours.
"""
import html, re, sys
text = open(sys.argv[1], encoding="utf-8").read()
COLORS = {30:"#2e3436",31:"#cc0000",32:"#4e9a06",33:"#c4a000",34:"#3465a4",35:"#75507b",36:"#06989a",37:"#d3d7cf",
          90:"#555753",91:"#ef2929",92:"#8ae234",93:"#fce94f",94:"#729fcf",95:"#ad7fa8",96:"#34e2e2",97:"#eeeeec"}
state = {"b":False,"r":False,"fg":None,"bg":None}
out = []
def span(t):
    fg, bg = state["fg"] or "#d3d7cf", state["bg"] or "#1e1e1e"
    if state["r"]: fg, bg = bg, fg
    style = f"color:{fg};background:{bg};" + ("font-weight:bold;" if state["b"] else "")
    return f'<span style="{style}">{html.escape(t)}</span>'
pos = 0
for m in re.finditer(r"\x1b\[([0-9;]*)m", text):
    if m.start() > pos: out.append(span(text[pos:m.start()]))
    codes = [int(c) for c in m.group(1).split(";") if c] or [0]
    i = 0
    while i < len(codes):
        c = codes[i]
        if c == 0: state.update(b=False, r=False, fg=None, bg=None)
        elif c == 1: state["b"] = True
        elif c == 7: state["r"] = True
        elif c == 22: state["b"] = False
        elif c == 27: state["r"] = False
        elif c == 39: state["fg"] = None
        elif c == 49: state["bg"] = None
        elif c in COLORS: state["fg"] = COLORS[c]
        elif 40 <= c <= 47: state["bg"] = COLORS[c-10]
        elif c in (38, 48) and i + 2 < len(codes) and codes[i+1] == 5:
            i += 2
        i += 1
    pos = m.end()
out.append(span(text[pos:]))
print('<html><body style="margin:0;background:#1e1e1e"><pre style="font:14px/1.25 \'DejaVu Sans Mono\',monospace;margin:12px;background:#1e1e1e">' + "".join(out) + "</pre></body></html>")
