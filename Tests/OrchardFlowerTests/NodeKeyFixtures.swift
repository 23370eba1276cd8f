import Foundation

/// Key files made by `ssh-keygen` and `openssl` when these tests were written (throwaway keys, never used elsewhere).
enum NodeKeyFixtures {
    static let sshP384 = """
        -----BEGIN OPENSSH PRIVATE KEY-----
        b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAiAAAABNlY2RzYS
        1zaGEyLW5pc3RwMzg0AAAACG5pc3RwMzg0AAAAYQT9SPMafZyYZp1KPbYxjNT7rdoounJi
        +ZE2C4QwbzsNgRYXAozOK3JOhA0gbfQHutNEcSr2+eLj2PpRaae6QupbZJOII5tKYH42cT
        qH61DHtcLFQCAHAe8INzlAMKUx00wAAADQexxre3sca3sAAAATZWNkc2Etc2hhMi1uaXN0
        cDM4NAAAAAhuaXN0cDM4NAAAAGEE/UjzGn2cmGadSj22MYzU+63aKLpyYvmRNguEMG87DY
        EWFwKMzityToQNIG30B7rTRHEq9vni49j6UWmnukLqW2STiCObSmB+NnE6h+tQx7XCxUAg
        BwHvCDc5QDClMdNMAAAAMFXztaEHBD2iUvvmxopv3lIzgHWGlp23+EWMYgWkJjgwAMOIjB
        tnkeAwo+xZ8Iz5VAAAAAdmaXh0dXJlAQ==
        -----END OPENSSH PRIVATE KEY-----
        """
    static let sshP384Public = """
        ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBP1I8xp9nJhmnUo9tjGM1Put2ii6cmL5kTYLhDBvOw2BFhcCjM4rck6EDSBt9Ae600RxKvb54uPY+lFpp7pC6ltkk4gjm0pgfjZxOofrUMe1wsVAIAcB7wg3OUAwpTHTTA== fixture
        """
    static let sshEncrypted = """
        -----BEGIN OPENSSH PRIVATE KEY-----
        b3BlbnNzaC1rZXktdjEAAAAACmFlczI1Ni1jdHIAAAAGYmNyeXB0AAAAGAAAABDLciQoFQ
        q1ORl0MCBj06m4AAAAEAAAAAEAAACIAAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlz
        dHAzODQAAABhBOxqTlTsoIxmihQH6i0/1pQb4pnyTJBwD05pyYU7TMxy7hkb5xl050Wa3t
        JLUuBpaU5Lmll49/prpOKYvNqf6JmUi+Oz2TFrzA0Io1ba/hjiVXkAjqwNolQwlCEaPj6g
        LAAAANDg2dpUMsMjrJgFQKx5JfFyf77dWWA00k18uXmN5J6GkWxXGuXkgufo2Nqfq8SkCe
        wX6BNMw+ydD89X9ChOFM1+aPsod0nH17oYCkmwkw+mp2Ut5faZ7EyBKoqAgPitLKuTZIyJ
        2dGnKehJW/E5Li8MIGJpuuLt2rBEfOUuBvh4nQYwsVjCJcs106TkGYguxGUvY45K7c1Qkt
        QqWEjqnFzWpLWhu3PqUA6x3lWWtnW2M/6MOwx9rzANg6sNUGiOxutVRCMIk8kp4RWlB8oa
        OtqP
        -----END OPENSSH PRIVATE KEY-----
        """
    static let sshEd25519 = """
        -----BEGIN OPENSSH PRIVATE KEY-----
        b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
        QyNTUxOQAAACCBAvn/O2hF9sKKnlfFg7q02ZXGZS9JLRaVbksLFxlstgAAAIjpwf6P6cH+
        jwAAAAtzc2gtZWQyNTUxOQAAACCBAvn/O2hF9sKKnlfFg7q02ZXGZS9JLRaVbksLFxlstg
        AAAEDknXxtC1M+p4zUDeYEU/ICDFW0aPV/NRpJj/0MMIwbPoEC+f87aEX2woqeV8WDurTZ
        lcZlL0ktFpVuSwsXGWy2AAAAAmVkAQID
        -----END OPENSSH PRIVATE KEY-----
        """
    static let sshP256 = """
        -----BEGIN OPENSSH PRIVATE KEY-----
        b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAaAAAABNlY2RzYS
        1zaGEyLW5pc3RwMjU2AAAACG5pc3RwMjU2AAAAQQTzzxsJQqvWprlQ+c3AhQq6Q1I4Sk+S
        OHv2s9ym//ha43CfUuulqtXF/aQATwcKDnaHe/yNcM47Srm3NY8WDMcfAAAAoLH9nA2x/Z
        wNAAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBPPPGwlCq9amuVD5
        zcCFCrpDUjhKT5I4e/az3Kb/+FrjcJ9S66Wq1cX9pABPBwoOdod7/I1wzjtKubc1jxYMxx
        8AAAAgCWYH/3Hq+ZCMDBWOhCudvYu+ndvXgEilpL8WOIpHvWkAAAAEcDI1NgECAwQ=
        -----END OPENSSH PRIVATE KEY-----
        """
    static let pemPKCS8 = """
        -----BEGIN PRIVATE KEY-----
        MIG2AgEAMBAGByqGSM49AgEGBSuBBAAiBIGeMIGbAgEBBDAr+WHaZjC29MFXOyQS
        Ex4UrAe2DWHzVFtmrnjt03NuZ6eaZoL8yOTpBbokE35rkwihZANiAASelUY8Xf/z
        +wLb6Jj+JawXHT0uOLk4UYITAcj2kWqrOkZ0soocrb1TGZfIKznc8DkEuP/I1AXP
        +Z8wxR3gEOnBo+JVD49bDQ9bwzWXYL+sJe+jN1QQ7Qbo2m2SVyT82Ac=
        -----END PRIVATE KEY-----
        """
    static let pemSEC1 = """
        -----BEGIN EC PRIVATE KEY-----
        MIGkAgEBBDAr+WHaZjC29MFXOyQSEx4UrAe2DWHzVFtmrnjt03NuZ6eaZoL8yOTp
        BbokE35rkwigBwYFK4EEACKhZANiAASelUY8Xf/z+wLb6Jj+JawXHT0uOLk4UYIT
        Acj2kWqrOkZ0soocrb1TGZfIKznc8DkEuP/I1AXP+Z8wxR3gEOnBo+JVD49bDQ9b
        wzWXYL+sJe+jN1QQ7Qbo2m2SVyT82Ac=
        -----END EC PRIVATE KEY-----
        """
    static let pemP256 = """
        -----BEGIN PRIVATE KEY-----
        MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgaH/3ZVEk0SvNgNrH
        xDzW7bEHdv8IGYw7tiB714v9puihRANCAARxRkBQo+6BjlAkNCALdg2tbY+UTXrg
        +NVxThi2GHJ6wS4n8661uN/PoXpxGkj9MEkIf3kXtp5WIGJZ08pduxkp
        -----END PRIVATE KEY-----
        """
}
