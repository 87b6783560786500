"""(family)"""
