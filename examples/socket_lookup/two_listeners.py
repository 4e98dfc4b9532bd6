#!/usr/bin/env python3
"""Two TCP listeners in one process, for the socket-lookup hook's demo (scripts/demo.sh).

  two_listeners.py serve BLUE_PORT GREEN_PORT   listen on 127.0.0.1 at both ports (blue
                                                first, so blue is executor 0), answer each
                                                connection with the listener's name
  two_listeners.py ask FIRST LAST               connect to 127.0.0.1 at each port of
                                                FIRST..LAST, print "port listener" lines
"""
import socket
import sys
import threading


def serve(blue, green):
    listeners = []
    for port in (blue, green):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
        listeners.append(s)

    def answer(s, name):
        while True:
            c, _ = s.accept()
            with c:
                c.sendall(name.encode())

    for s, name in zip(listeners, (f"blue:{blue}", f"green:{green}")):
        threading.Thread(target=answer, args=(s, name), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # until the demo closes our stdin


def ask(first, last):
    for port in range(first, last + 1):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as c:
                print(port, c.recv(64).decode() or "-", flush=True)
        except OSError as e:
            print(port, f"refused ({e.strerror})", flush=True)


if __name__ == "__main__":
    mode, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    serve(a, b) if mode == "serve" else ask(a, b)
