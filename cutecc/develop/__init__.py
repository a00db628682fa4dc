"""Development aids that run the build side from the runtime, only where the user opted in: a
missed call's variant built just in time (`cutecc.load(jit=True)`).
"""
