"""(core)"""
